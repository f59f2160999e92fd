"""Canaries end to end: a real nats-server, a real daemon process, real canary subprocesses, ``vigil canary``."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from support import Daemon, NatsServer, SecuredDaemon, gone, run_producer, vigil, vigil_together, wait_for

HERE = Path(__file__).resolve().parents[1]
MLP = f"python {HERE.parent / 'examples' / 'train_mlp.py'} --steps 80"


def _toml(tmp_path: Path, canary: str, jobs: dict[str, str]) -> Path:
    """A daemon configuration: ``[canary]`` lines and ``[[canary.jobs]]`` (name -> its other lines)."""
    text = "[canary]\n" + canary + "\n"
    for name, body in jobs.items():
        text += f'[[canary.jobs]]\nname = "{name}"\n{body}\n'
    path = tmp_path / "vigil.toml"
    path.write_text(text)
    return path


@pytest.fixture
def daemons(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[Daemon]]:
    """Daemons a test starts (``Daemon(...).start()`` then append); killed if still running at the end."""
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.process is not None and d.process.poll() is None:
            try:
                d.terminate()  # SIGTERM: the daemon stops its bundled nats-server too (SIGKILL would orphan it)
            except subprocess.TimeoutExpired:
                d.kill()


def _daemon(daemons: list[Daemon], nats_server: NatsServer, tmp_path: Path, *args: str, **env: str) -> Daemon:
    d = Daemon(nats_server.url, tmp_path / "data", *args, env=env)
    d.start()
    daemons.append(d)
    return d


def _rows(data_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    """After the daemon exited: its file as it left it."""
    with duckdb.connect(str(data_dir / "vigil.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_canary_run_passes_nan_grad_on_the_supervised_workload_and_shows_it_in_metrics_and_list(
    daemons: list[Daemon], nats_server: NatsServer, tmp_path: Path
) -> None:
    d = _daemon(daemons, nats_server, tmp_path, VIGIL_CANARY_LINGER_S="1")
    where = ["--nats", nats_server.url, "--data-dir", str(d.data_dir)]
    # 20 000 steps would take minutes: the job is stopped linger_s (1 s here, 5 s by default) after non_finite paged.
    done = vigil("canary", "run", "--fault", "nan_grad", "--steps", "20000", "--fault-step", "100", *where,
                 "--format", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {k: result[k] for k in ("workload", "fault", "verdict", "fired_detector", "fault_step", "fired_step")} == {
        "workload": "supervised",
        "fault": "nan_grad",
        "verdict": "pass",
        "fired_detector": "non_finite",
        "fault_step": 100,
        "fired_step": 100,
    }
    assert result["name"].startswith("canary-") and result["latency_steps"] == 0
    assert result["detail"].endswith("; its job was stopped once judged") and result["duration_s"] < 60
    last_step = d.scalar(f"select max(step) from steps where run_id = '{result['name']}'")
    assert 100 < last_step < 20000 - 1
    assert "supervised nan_grad@100, expects non_finite: queued" in done.stderr
    assert "non_finite page open at step 100" in done.stderr and "1 of 1 canaries passed" in done.stderr

    with urllib.request.urlopen(f"http://127.0.0.1:{d.http_port}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert 'vigil_canary_verdicts_total{fault="nan_grad",verdict="pass"} 1' in metrics
    assert 'vigil_canary_last_passed{fault="nan_grad"} 1' in metrics
    assert 'vigil_canary_last_timestamp_seconds{fault="nan_grad"}' in metrics
    listed = vigil("canary", "list", *where, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["run_id"], r["verdict"]) for r in map(json.loads, listed.stdout.splitlines())] == [
        (result["name"], "pass")
    ]
    assert (
        d.scalar(f"select count(*) from anomalies where run_id = '{result['name']}' and detector = 'canary_failed'")
        == 0
    )


def test_a_canary_whose_detector_is_switched_off_fails_and_its_canary_failed_page_is_stored_and_published(
    daemons: list[Daemon], nats_server: NatsServer, tmp_path: Path
) -> None:
    config = _toml(tmp_path, "settle_s = 30", {"mlp": f'command = "{MLP}"\nfault_step = 50'})
    d = Daemon(nats_server.url, tmp_path / "data", "--config", str(config),
               env={"VIGIL_DETECTORS_NON_FINITE_ENABLED": "false"})  # fmt: skip
    d.launch()  # the follower needs only the broker: both start up at the same time
    daemons.append(d)
    follow = subprocess.Popen(
        [sys.executable, "-m", "trainvigil.daemon.cli", "alerts", "--follow", "--format", "json", "--nats",
         nats_server.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    following = threading.Event()

    def said() -> None:
        for line in follow.stderr or []:
            if "following" in line:
                following.set()

    readers = [threading.Thread(target=said), threading.Thread(target=lambda: lines.extend(follow.stdout or []))]
    for reader in readers:
        reader.start()
    try:
        d.wait_ready()
        assert following.wait(30), "vigil alerts --follow subscribed"
        done = vigil("canary", "run", "--fault", "nan_grad", "--workload", "mlp", "--config", str(config),
                     "--nats", nats_server.url, "--data-dir", str(d.data_dir))  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "mlp nan_grad@50, expects non_finite" in done.stderr and "0 of 1 canaries passed" in done.stderr
        run_id = "canary-" + done.stdout.split("| canary-", 1)[1].split()[0]
        verdict = d.sql(f"select verdict, detail, expected_detector from canary_results where name = '{run_id}'")
        assert verdict.rows == [["fail", "non_finite raised nothing after the fault at step 50", "non_finite"]]
        page = d.sql("select run_id, severity, step, message from anomalies where detector = 'canary_failed'").rows
        assert [r[:3] for r in page] == [[run_id, "page", 50]]
        assert "non_finite no longer catches nan_grad" in page[0][3]
        wait_for(lambda: any('"canary_failed"' in line for line in lines), 30, "the page on vigil.v1.alerts.<run>")
        published = json.loads(next(line for line in lines if '"canary_failed"' in line))
        assert (published["run_id"], published["severity"]) == (run_id, "page")
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            follow.wait(30)
        finally:
            follow.kill()  # a no-op once it exited; else its readers would keep pytest from ever exiting
        for reader in readers:
            reader.join(10)
        for pipe in (follow.stdout, follow.stderr):
            if pipe is not None:
                pipe.close()


HANG = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""
"""A job that never ends, with a child that ignores SIGINT (a stubborn data-loader worker)."""


def test_a_canary_hanging_past_timeout_is_killed_with_its_whole_group_while_ingest_goes_on(
    daemons: list[Daemon], nats_server: NatsServer, tmp_path: Path
) -> None:
    script, pids = tmp_path / "hang.py", tmp_path / "pids"
    script.write_text(HANG)
    config = _toml(tmp_path, "timeout_s = 8\nsettle_s = 1", {"hang": f'command = "python {script} {pids}"'})
    d = _daemon(daemons, nats_server, tmp_path, "--config", str(config))
    trigger = subprocess.Popen(
        [sys.executable, "-m", "trainvigil.daemon.cli", "canary", "run", "--fault", "none", "--workload", "hang",
         "--config", str(config), "--nats", nats_server.url, "--data-dir", str(d.data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(pids.exists, 30, "the job to start")
    leader, child = map(int, pids.read_text().split())
    assert os.getpgid(child) == leader != os.getpgid(0), "the job leads a process group of its own"
    assert os.getpriority(os.PRIO_PROCESS, leader) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10), "nice = 10"
    producer = run_producer(nats_server.url, "real-run", 0, 200, "--pace", "0.01")
    try:
        wait_for(lambda: d.scalar("select count(*) from steps where run_id = 'real-run'") == 200, 30, "real steps")
        assert not gone(leader), "ingest went on while the canary hung"
        _, err = trigger.communicate(timeout=60)
    finally:
        producer.communicate(timeout=30)
    assert trigger.returncode == 1, err
    wait_for(lambda: gone(leader) and gone(child), 10, "no process of the group left")
    rows = d.sql("select verdict, detail, exit_code from canary_results").rows
    assert len(rows) == 1 and rows[0][0] == "error" and rows[0][2] < 0
    assert rows[0][1].startswith("still running after timeout_s; its process group was killed")
    alert = d.sql("select severity from anomalies where detector = 'canary_failed'").rows
    assert alert == [["warn"]], "a canary that could not run warns; it proves nothing about the detectors"


SLEEPER = """
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"start {os.getpid()} {time.time()}\\n")
time.sleep(2.5)
with open(sys.argv[1], "a") as f:
    f.write(f"end {os.getpid()} {time.time()}\\n")
"""


def _timeline(path: Path) -> tuple[list[float], dict[int, tuple[float, float | None]]]:
    """The sleepers' start times, and per pid (start, end or None while it runs)."""
    jobs: dict[int, tuple[float, float | None]] = {}
    for line in path.read_text().splitlines():
        what, pid, at = line.split()
        start = jobs.get(int(pid), (float(at), None))[0]
        jobs[int(pid)] = (start, float(at) if what == "end" else None)
    return sorted(s for s, _ in jobs.values()), jobs


@pytest.mark.serial  # asserts the starts' spacing against a 1 s tick, which a loaded machine's late starts skew
def test_the_schedule_runs_canaries_on_its_interval_at_most_concurrency_at_once_and_sigterm_aborts_them(
    daemons: list[Daemon], nats_server: NatsServer, tmp_path: Path
) -> None:
    script, timeline = tmp_path / "sleeper.py", tmp_path / "timeline"
    script.write_text(SLEEPER)
    canary = 'enabled = true\nevery = "1s"\nconcurrency = 2\nsettle_s = 0.2\nworkloads = []\nfault_probability = 0'
    config = _toml(tmp_path, canary, {"sleeper": f'command = "python {script} {timeline}"'})
    d = _daemon(daemons, nats_server, tmp_path, "--config", str(config))
    wait_for(lambda: d.scalar("select count(*) from canary_results") >= 3, 60, "three scheduled canaries judged")

    def one_running() -> int | None:
        _, jobs = _timeline(timeline)
        return next((pid for pid, (_, end) in jobs.items() if end is None and not gone(pid)), None)

    wait_for(lambda: one_running() is not None, 30, "a canary running")
    running = one_running()
    assert running is not None
    assert d.terminate() == 0
    assert gone(running), "shutdown killed the running canary"

    starts, jobs = _timeline(timeline)
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(starts)), f"one start per 1 s tick: {starts}"
    ends = [end for _, end in jobs.values() if end is not None]
    most = max(sum(1 for s, e in jobs.values() if s <= t and (e is None or t < e)) for t in starts)
    assert most == 2, f"at most concurrency = 2 at once, and the schedule used both: {jobs}"
    verdicts = _rows(d.data_dir, "select verdict, workload, fault, count(*) from canary_results group by all")
    counted = {v: n for v, _, _, n in verdicts}
    assert counted["pass"] >= len(ends) - 1 and counted["aborted"] >= 1, verdicts
    assert {(w, f) for _, w, f, _ in verdicts} == {("sleeper", "none")}, "fault_probability = 0: clean twins only"
    aborted = _rows(d.data_dir, "select detail, exit_code from canary_results where verdict = 'aborted'")
    assert all(detail.startswith("the daemon stopped first") and code is None for detail, code in aborted)
    assert "canary_skipped" in d.log.read_text(), "ticks while both slots were busy were skipped"


CREDS_THEN_TRAIN = """
import os, runpy, sys
with open(sys.argv[1], "w") as f:
    f.write(os.environ.get("VIGIL_NATS_CREDS", ""))
sys.argv = [sys.argv[2], "--steps", "80"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""Says which credentials the job got, then trains like ``examples/train_mlp.py``."""


def test_with_auth_on_a_canary_connects_as_an_agent_and_only_the_daemons_credentials_trigger_one(
    tmp_path: Path,
) -> None:
    script, said = tmp_path / "creds_then_train.py", tmp_path / "creds"
    script.write_text(CREDS_THEN_TRAIN)
    mlp = HERE.parent / "examples" / "train_mlp.py"
    config = _toml(tmp_path, "settle_s = 30", {"mlp": f'command = "python {script} {said} {mlp}"\nfault_step = 50'})
    d = SecuredDaemon(tmp_path / "data", "--config", str(config))
    d.start()
    try:
        where = ["--config", str(config), "--nats", d.nats_url, "--data-dir", str(d.data_dir)]
        run = ["canary", "run", "--fault", "nan_grad", "--workload", "mlp", *where, "--creds"]
        refused, done = vigil_together([*run, str(d.creds("reader"))], [*run, str(d.creds("daemon"))])
        assert refused.returncode == 2, refused.stderr
        assert "does not let these credentials trigger canaries" in refused.stderr
        assert done.returncode == 0, done.stderr + d.log.read_text()[-3000:]
        assert said.read_text() == str(d.creds("agent").resolve()), "the agent's file, never the daemon's"
    finally:
        if d.process is not None and d.process.poll() is None:
            d.terminate()  # SIGTERM: the daemon stops its bundled nats-server too (SIGKILL would orphan it)
