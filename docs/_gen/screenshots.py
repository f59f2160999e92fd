"""The web view's screenshots in ``docs/``, made from the demo's data with headless chromium.

Starts ``vigil up`` (the bundled nats-server) in a temporary directory, trains the demo's loop
(``trainvigil.daemon.cli.demo_train``, one corrupt batch fed on purpose) as two runs of two ranks each,
waits until every step is stored, then opens the Runs, Run and Compare pages in Debian's chromium
(Playwright, its own browser download unused) and writes ``docs/web-runs.png``, ``docs/web-run.png`` and
``docs/web-compare.png``. Run it after changing the web view::

    python docs/_gen/screenshots.py [--steps 400] [--out docs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
RUNS = ("demo", "demo-again")
RANKS = 2
WIDTH, HEIGHT = 1400, 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.2)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _steps_stored(nats_url: str) -> int:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainvigil.daemon.cli",
            "sql",
            "--nats",
            nats_url,
            "--format",
            "csv",
            "select count(*) from steps",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines else 0


def _train(nats_url: str, steps: int) -> None:
    """The demo's training loop, each run on two ranks, the two runs' ranks at once."""
    procs = []
    for run in RUNS:
        for rank in range(RANKS):
            env = {
                **os.environ,
                "VIGIL_NATS_URL": nats_url,
                "VIGIL_RUN_ID": run,
                "RANK": str(rank),
                "WORLD_SIZE": str(RANKS),
            }
            spike = steps * 2 // 3 if run == RUNS[0] and rank == 0 else -1
            command = [
                sys.executable,
                "-m",
                "trainvigil.daemon.cli.demo_train",
                "--steps",
                str(steps),
                "--spike-at",
                str(spike),
            ]
            procs.append(subprocess.Popen(command, env=env))
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"screenshots: the demo's training exited {proc.returncode}")


def _shoot(base: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    pages = {
        "web-runs.png": "/",
        "web-run.png": f"/run?id={RUNS[0]}",
        "web-compare.png": f"/compare?metric=loss&id={RUNS[0]}&id={RUNS[1]}&ranks=all",
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
            tab = context.new_page()
            for name, path in pages.items():
                tab.goto(base + path)
                tab.wait_for_function("() => document.body.dataset.ready === '1'", timeout=20_000)
                if tab.locator("#log").count():
                    tab.check("#log")  # the corrupt batch's spike would flatten the rest on a linear scale
                tab.wait_for_timeout(1000)  # the charts' last frame after the data came
                tab.screenshot(path=str(out / name), full_page=name == "web-run.png")
                print(f"screenshots: wrote {out / name}")
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="training steps per rank (default 400)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go (default docs/)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"screenshots: {CHROMIUM} is missing (Debian: apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="vigil-shots-"))
    nats_port, http_port = _free_port(), _free_port()
    nats_url, base = f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{http_port}"
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainvigil.daemon.cli",
            "up",
            "--data-dir",
            str(work / "data"),
            "--embedded-port",
            str(nats_port),
            "--http-port",
            str(http_port),
        ],
        env={**os.environ, "VIGIL_LOG_LEVEL": "warning"},
    )
    try:
        _wait("the daemon's /healthz", lambda: _answers(base + "/healthz"), 60)
        _train(nats_url, args.steps)
        expected = len(RUNS) * RANKS * args.steps
        _wait(f"{expected} steps stored", lambda: _steps_stored(nats_url) >= expected, 120)
        _shoot(base, args.out)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
