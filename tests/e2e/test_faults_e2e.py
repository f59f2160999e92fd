"""``VIGIL_FAULT`` in real training scripts, through a real nats-server and daemon, into DuckDB."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import duckdb
from support import ROOT, Daemon, NatsServer, wait_for

from trainvigil.daemon.broker.embedded import free_port

# The demo's loop is an ordinary user script: watch(grad_norm=False), clip_grad_norm_, log its norm.
DEMO = [sys.executable, "-m", "trainvigil.daemon.cli.demo_train"]
MLP = [sys.executable, str(ROOT / "examples" / "train_mlp.py")]
# A loop that never calls watch(): nothing can apply a fault.
UNWATCHED = [
    sys.executable,
    "-c",
    "import sys, trainvigil\n"
    "with trainvigil.init() as vigil:\n"
    "    for step in range(int(sys.argv[2])):\n"
    "        vigil.log(step, loss=1.0)\n",
]


def _start(command: list[str], url: str, run_id: str, fault: str | None, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VIGIL_NATS_URL": url, "VIGIL_RUN_ID": run_id, "VIGIL_FLUSH_INTERVAL": "0.05"}
    env.pop("VIGIL_FAULT", None)
    if fault is not None:
        env["VIGIL_FAULT"] = fault
    env["VIGIL_HEARTBEAT_INTERVAL"] = "0.2"
    return subprocess.Popen([*command, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _ok(proc: subprocess.Popen[bytes]) -> str:
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


def _rows(daemon: Daemon, sql: str) -> list[tuple[Any, ...]]:
    """After the daemon exited: read its file directly (every committed row, nothing still in flight)."""
    with duckdb.connect(str(daemon.data_dir / "vigil.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


_FAULT_EVENTS = (
    "select run_id, kind, step, json_extract_string(fields, '$.kind') from events "
    "where kind like 'fault_%' order by run_id, step"
)


def test_nan_grad_at_50_is_an_event_and_a_non_finite_page_at_50_and_its_clean_twin_stays_silent(
    daemon: Daemon, nats_server: NatsServer
) -> None:
    steps = "80"
    faulted = _start(DEMO, nats_server.url, "fault-nan", "nan_grad@50", "--steps", steps)
    clean = _start(DEMO, nats_server.url, "fault-clean", None, "--steps", steps)
    assert "VIGIL_FAULT injected nan_grad at step 50" in _ok(faulted)
    assert "VIGIL_FAULT" not in _ok(clean)
    wait_for(
        lambda: daemon.scalar("select count(*) from runs where run_id like 'fault-%' and status = 'ok'") == 2,
        60,
        "both runs ended and committed",
    )
    wait_for(lambda: daemon.scalar("select count(*) from anomalies where run_id = 'fault-nan'") > 0, 60, "the page")
    assert daemon.terminate() == 0  # drains and commits: what follows is final

    assert _rows(daemon, _FAULT_EVENTS) == [("fault-nan", "fault_injected", 50, "nan_grad")]
    anomalies = _rows(daemon, "select run_id, detector, step, severity from anomalies order by run_id, step")
    assert ("fault-nan", "non_finite", 50, "page") in anomalies
    assert [a for a in anomalies if a[0] == "fault-clean"] == [], "the clean twin raised nothing"
    assert _rows(daemon, "select run_id, count(*) from steps group by run_id order by run_id") == [
        ("fault-clean", 80),
        ("fault-nan", 80),
    ]


def test_the_example_script_with_nan_grad_at_50_pages_non_finite_at_50(daemon: Daemon, nats_server: NatsServer) -> None:
    """The documented recipe: ``VIGIL_FAULT=nan_grad@50 python examples/train_mlp.py`` against ``vigil up``."""
    _ok(_start(MLP, nats_server.url, "fault-mlp", "nan_grad@50", "--steps", "80"))
    wait_for(lambda: daemon.scalar("select count(*) from anomalies where run_id = 'fault-mlp'") > 0, 60, "the page")
    assert daemon.terminate() == 0
    assert _rows(daemon, _FAULT_EVENTS) == [("fault-mlp", "fault_injected", 50, "nan_grad")]
    anomalies = _rows(daemon, "select detector, step, severity from anomalies where run_id = 'fault-mlp'")
    assert ("non_finite", 50, "page") in anomalies


def test_a_malformed_variable_stops_the_script_with_one_line_naming_the_valid_kinds() -> None:
    # trainvigil.init() reads VIGIL_FAULT: a script that never imports torch stops on the same line, ~2 CPU-s sooner.
    proc = _start(UNWATCHED, f"nats://127.0.0.1:{free_port()}", "fault-typo", "nan_gard@50", "--steps", "5")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    last = err.decode().strip().splitlines()[-1]
    assert last == (
        "trainvigil.errors.ConfigError: VIGIL_FAULT='nan_gard@50': unknown kind 'nan_gard' (did you mean "
        "'nan_grad'?); valid kinds: nan_grad, grad_spike, lr_spike, slowdown, stall, ckpt_corrupt, gil; "
        "write VIGIL_FAULT=<kind>@<step>[,<kind>@<step>], e.g. nan_grad@50"
    )


def test_a_plan_a_script_cannot_apply_is_a_fault_missed_event_and_a_warning(
    daemon: Daemon, nats_server: NatsServer
) -> None:
    """A loop that never calls watch(): the fault is not injected, and the run says so."""
    err = _ok(_start(UNWATCHED, nats_server.url, "fault-unwatched", "nan_grad@50", "--steps", "80"))
    assert "VIGIL_FAULT=nan_grad@50 was never injected: no trainvigil.torch.watch" in err
    wait_for(
        lambda: daemon.scalar("select count(*) from runs where run_id = 'fault-unwatched' and status = 'ok'") == 1,
        60,
        "the run's end",
    )
    assert daemon.terminate() == 0
    assert _rows(daemon, _FAULT_EVENTS) == [("fault-unwatched", "fault_missed", None, "nan_grad")]
    assert _rows(daemon, "select count(*) from anomalies") == [(0,)]


def test_stall_stops_the_steps_while_the_process_stays_alive_and_heartbeats_go_on(
    daemon: Daemon, nats_server: NatsServer
) -> None:
    proc = _start(DEMO, nats_server.url, "fault-stall", "stall@30", "--steps", "200")
    try:
        wait_for(
            lambda: (
                daemon.scalar("select count(*) from events where run_id = 'fault-stall' and kind = 'fault_injected'")
                == 1
            ),
            60,
            "the stall's event",
        )
        wait_for(lambda: daemon.scalar("select max(step) from steps where run_id = 'fault-stall'") == 29, 30, "step 29")
        beats = "select count(*) from heartbeats where run_id = 'fault-stall' and last_step = 29"
        seen = daemon.scalar(beats)
        wait_for(lambda: daemon.scalar(beats) >= seen + 5, 30, "five more heartbeats, all still at step 29")
        assert proc.poll() is None, "the process stays alive"
        assert daemon.scalar("select max(step) from steps where run_id = 'fault-stall'") == 29
        assert daemon.scalar("select max(last_step) from heartbeats where run_id = 'fault-stall'") == 29
    finally:
        proc.kill()
        proc.communicate(timeout=30)
