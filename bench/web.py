"""The web view's costs: time to first chart, commit-to-browser latency, and what open pages and
HTTP load cost the ingest.

Runs a real nats-server and ``vigil up``, real agents (``bench/_agents.py``) and Debian's chromium
(Playwright), and prints a table:

1. Time to first chart of a run of 1 000, 100 000 and 1 000 000 steps x 4 ranks (written into the
   history file before the daemon starts): server (``/api/run`` and one ``/api/series``, median of 5)
   and browser (navigation to the first chart drawn, and to every chart drawn).
2. Commit -> browser latency of live updates (p50/p99): a run logging 20 steps/s with its page open;
   the page records ``now - committed_at`` of each notice once it has redrawn.
3. Ingest throughput (steps/s committed) of 2 producers x STEPS steps: alone, with 10 live pages open
   on the runs being ingested, and with 200 concurrent page/data requests in flight all along.

   The three run in turn, ``--rounds`` times; a ratio is the median of the rounds' ratios (the machine
   is shared, so one round says little).

Usage: ``python bench/web.py [--steps 150000] [--rounds 3] [--skip-first-chart]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _agents import collect, go, spawn_producers
from _procs import start_daemon, start_nats
from tables import table

from trainvigil.testing import steps_committed, wait_until

CHROMIUM = "/usr/bin/chromium"
SIZES = (1_000, 100_000, 1_000_000)
RANKS = 4


def _prefill(data_dir: Path) -> None:
    """Runs ``size-N`` of N steps x 4 ranks, written straight into a new history file."""
    from trainvigil.daemon.store.writer import Store

    store = Store(data_dir / "vigil.duckdb")
    try:
        for n in SIZES:
            run = f"size-{n}"
            store.con.execute(
                "INSERT INTO runs VALUES (?, now() - INTERVAL 1 HOUR, now(), ?, 'ok', now(), NULL)", [run, RANKS]
            )
            store.con.execute(
                "INSERT INTO steps (run_id, rank, step, time, loss, grad_norm, lr, step_time) "
                "SELECT ?, r, s, now() - INTERVAL 1 HOUR + s * INTERVAL 1 MILLISECOND, "
                "2 * exp(-s / ?) + random() * 0.05, 1 + random(), 3e-4, 0.1 + random() * 0.01 "
                "FROM range(?) t(r), range(?) u(s)",
                [run, n / 5, RANKS, n],
            )
    finally:
        store.close()


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=60, trust_env=False)


def _median_ms(call: Callable[[], Any], times: int = 5) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


class _Ticker:
    """Commits one step on demand: answers shared between requests are then out of date (cold again)."""

    def __init__(self, url: str, port: int) -> None:
        import trainvigil

        self.agent = trainvigil.init("bench-tick", 0, url, flush_interval=0.05)
        self.port, self.step = port, 0

    def __call__(self) -> None:
        before = steps_committed(self.port)
        self.agent.log(self.step, loss=1.0)
        self.step += 1
        assert self.agent.flush(10)
        wait_until(lambda: steps_committed(self.port) > before, 30, "the tick committed", 0.01)


def first_chart(base: str, browser: Any, cold: _Ticker) -> list[list[str]]:
    rows = []
    for n in SIZES:
        run = f"size-{n}"

        def server(run: str = run) -> None:
            _get(f"{base}/api/run?id={run}").raise_for_status()
            _get(f"{base}/api/series?id={run}&metric=loss&nranks={RANKS}").raise_for_status()

        def navigate(run: str = run) -> tuple[float, float]:
            page = browser.new_page()
            started = time.perf_counter()
            page.goto(f"{base}/run?id={run}")
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
            every = (time.perf_counter() - started) * 1000
            first = page.evaluate("window.vigil.firstChart")
            page.close()
            return first, every

        cold()
        server_cold = _median_ms(server, 1)
        server_warm = _median_ms(server, 4)
        cold()
        first, every = navigate()
        warm = statistics.median(navigate()[1] for _ in range(2))
        rows.append(
            [
                f"{n:,} x {RANKS}",
                f"{server_cold:.0f}",
                f"{server_warm:.0f}",
                f"{first:.0f}",
                f"{every:.0f}",
                f"{warm:.0f}",
            ]
        )
    return rows


def live_latency(base: str, url: str, browser: Any, seconds: float = 15) -> tuple[float, float, int]:
    import trainvigil

    agent = trainvigil.init("live-latency", 0, url, flush_interval=0.05)
    try:
        agent.log(0, loss=1.0, grad_norm=1.0)
        assert agent.flush(10)
        wait_until(lambda: _get(f"{base}/api/run?id=live-latency").status_code == 200, 30, "the run")
        page = browser.new_page()
        page.goto(f"{base}/run?id=live-latency")
        page.wait_for_function("document.body.dataset.ready === '1' && document.querySelector('#live.on')")
        step, end = 1, time.monotonic() + seconds
        while time.monotonic() < end:
            agent.log(step, loss=1.0 / (step + 1), grad_norm=1.0 + (step % 7) / 10)
            step += 1
            time.sleep(0.05)
        latencies = np.array(page.evaluate("window.vigil.latencies")) * 1000
        page.close()
    finally:
        agent.close(10)
    return float(np.percentile(latencies, 50)), float(np.percentile(latencies, 99)), len(latencies)


def ingest(tmp: Path, url: str, port: int, steps: int, tag: str, during: Callable[[list[str]], Any] | None) -> float:
    """Steps/s committed for 2 producers x ``steps``, with ``during(run_ids)`` running meanwhile."""
    runs = [f"{tag}-{i}" for i in range(2)]
    before = steps_committed(port)
    with contextlib.ExitStack() as stack:
        producers = spawn_producers(stack, tmp, [[run, url, str(steps)] for run in runs])
        side = during(runs) if during is not None else contextlib.nullcontext()
        with side:
            started = go(producers)
            wait_until(lambda: steps_committed(port) - before >= 2 * steps, 600, "every step committed", 0.02)
            elapsed = time.time() - started
        collect(producers)
    return 2 * steps / elapsed


class _Pages:
    """10 live run pages on the runs being ingested, 5 per browser (a browser gives a host ~6 connections
    and each live page holds one)."""

    def __init__(self, base: str, browsers: list[Any], runs: list[str]) -> None:
        self.base, self.browsers, self.runs = base, browsers, runs
        self.pages: list[Any] = []

    def __enter__(self) -> _Pages:
        for run in self.runs:  # the producers' run_start, sent once connected

            def listed(run: str = run) -> bool:
                return _get(f"{self.base}/api/run?id={run}").status_code == 200

            wait_until(listed, 30, f"run {run}")
        for i in range(10):
            page = self.browsers[i % len(self.browsers)].new_page()
            page.goto(f"{self.base}/run?id={self.runs[i % len(self.runs)]}")
            page.wait_for_function("document.body.dataset.ready === '1' && document.querySelector('#live.on')")
            self.pages.append(page)
        return self

    def __exit__(self, *exc: object) -> None:
        self.updates = sum(p.evaluate("window.vigil.updates") for p in self.pages)
        for page in self.pages:
            page.close()


class _Requests:
    """200 concurrent page/data requests in flight, on their own thread, until the block ends."""

    def __init__(self, base: str, runs: list[str]) -> None:
        self.base, self.runs = base, runs
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.errors = 0

    def __enter__(self) -> _Requests:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._load()))
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    async def _load(self) -> None:
        paths = ["/", "/api/runs", "/static/vigil.js", "/healthz"] + [
            f"/api/series?id={r}&metric=loss&nranks=1" for r in self.runs
        ]
        await asyncio.gather(*(self._worker(i, paths) for i in range(200)))

    async def _worker(self, i: int, paths: list[str]) -> None:
        """One keep-alive connection asking in turn (a bare HTTP/1.1 client: httpx's own CPU would be the
        bottleneck at 200 connections on a small machine, not the daemon)."""
        host, port = self.base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        n = i
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                writer.write(f"GET {paths[n % len(paths)]} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                if status == 200:
                    self.latencies.append(time.perf_counter() - started)
                else:
                    self.errors += 1
                n += 1
        finally:
            writer.close()


def ingest_rounds(tmp: Path, url: str, port: int, steps: int, rounds: int, browsers: list[Any]) -> list[list[object]]:
    """``rounds`` rounds of alone / 10 live pages / 200 concurrent requests, interleaved so that what else
    the machine runs meanwhile weighs on all three alike; each ratio is the median of its rounds' ratios."""
    base = f"http://127.0.0.1:{port}"
    alone, pages, load = [], [], []
    updates, requests, errors, latencies = 0, 0, 0, []
    for i in range(rounds):
        alone.append(ingest(tmp, url, port, steps, f"alone{i}", None))
        open_pages = _Pages(base, browsers, [])

        def with_pages(runs: list[str], side: _Pages = open_pages) -> _Pages:
            side.runs = runs
            return side

        pages.append(ingest(tmp, url, port, steps, f"pages{i}", with_pages))
        updates += open_pages.updates
        http = _Requests(base, [])

        def with_load(runs: list[str], side: _Requests = http) -> _Requests:
            side.runs = runs
            return side

        load.append(ingest(tmp, url, port, steps, f"load{i}", with_load))
        requests, errors = requests + len(http.latencies), errors + http.errors
        latencies += http.latencies
        print(
            f"round {i + 1}: alone {alone[-1]:,.0f}, pages {pages[-1]:,.0f}, load {load[-1]:,.0f} steps/s", flush=True
        )
    lat = np.array(latencies) * 1000

    def ratio(arm: list[float]) -> str:
        return f"{statistics.median(a / b for a, b in zip(arm, alone, strict=True)):.2f}"

    def spread(arm: list[float]) -> str:
        return f"{statistics.median(arm):,.0f} ({min(arm):,.0f}-{max(arm):,.0f})"

    return [
        ["alone", spread(alone), "1.00", ""],
        ["10 live pages", spread(pages), ratio(pages), f"{updates} page updates"],
        [
            "200 concurrent requests",
            spread(load),
            ratio(load),
            f"{requests:,} requests, p50 {np.percentile(lat, 50):.0f} ms, p99 {np.percentile(lat, 99):.0f} ms, "
            f"{errors} errors",
        ],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150_000, help="steps per producer in the ingest runs")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three ingest runs (medians)")
    parser.add_argument("--skip-first-chart", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as name, contextlib.ExitStack() as stack, sync_playwright() as p:
        tmp = Path(name)
        (tmp / "data").mkdir()
        if not args.skip_first_chart:
            _prefill(tmp / "data")
        nats, url = start_nats(stack, tmp)
        svc = start_daemon(stack, tmp, nats, url)
        base = f"http://127.0.0.1:{svc.http_port}"
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        if not args.skip_first_chart:
            ticker = _Ticker(url, svc.http_port)
            stack.callback(ticker.agent.close, 10)
            head = ["run", "server cold ms", "server warm ms", "browser: first chart ms", "browser: all charts ms"]
            print(table([*head, "all charts, answers shared ms"], first_chart(base, browser, ticker)))
        p50, p99, n = live_latency(base, url, browser)
        print(f"\ncommit -> browser latency: p50 {p50:.0f} ms, p99 {p99:.0f} ms ({n} updates)")
        second = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        rows = ingest_rounds(tmp, url, svc.http_port, args.steps, args.rounds, [browser, second])
        print()
        print(table(["ingest (2 producers)", "steps/s, median (range)", "ratio", "HTTP side"], rows))
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
