"""What agents send reaches a terminal as text, never as control sequences: ``terminal_safe`` and the CLI's tables.

An agent on the bus chooses its run id, metric names, checkpoint paths and crash message. Printed raw, an escape
sequence in one of them retitles the terminal, clears it, or (a bidi override, a carriage return) makes a line read
as something else. The machine formats (JSON, CSV) keep every character exactly.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from inprocess import InProcessDaemon
from support import wait_for

import trainvigil
from trainvigil.daemon.formatting import render, terminal_safe
from trainvigil.schemas.query import QueryResult

TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
EVIL_RUN = f"evil{TITLE}{CLEAR}\r\u202eok"
EVIL_METRIC = f"m{CLEAR}"
EVIL_CRASH = f"ValueError: {TITLE}{CLEAR}\x9b31m"


def test_terminal_safe_escapes_c0_c1_del_and_bidi_controls_and_keeps_other_text() -> None:
    assert terminal_safe(f"a{TITLE}b") == r"a\x1b]0;pwned\x07b"
    assert terminal_safe("x\r\n\ty\x7f\x9b") == r"x\x0d\x0a\x09y\x7f\x9b"
    assert terminal_safe("\u202eabc\u2066\u200f") == r"\u202eabc\u2066\u200f"
    assert terminal_safe("plain text, é, 日本, 🙂, C:\\path") == "plain text, é, 日本, 🙂, C:\\path"


def test_a_table_escapes_every_cell_and_column_name_and_stays_aligned() -> None:
    result = QueryResult(columns=["run_id", f"c{CLEAR}"], rows=[[EVIL_RUN, 1.5], ["ok", None]])
    table = render(result, "table")
    assert "\x1b" not in table and "\r" not in table and "\u202e" not in table
    lines = table.splitlines()
    assert len({len(line) for line in lines[:-1]}) == 1, table  # every line of the box is as wide
    assert terminal_safe(EVIL_RUN) in table


def test_csv_and_json_keep_the_data_exact() -> None:
    result = QueryResult(columns=["run_id"], rows=[[EVIL_RUN]])
    assert list(csv.reader(io.StringIO(render(result, "csv"), newline=""))) == [["run_id"], [EVIL_RUN]]
    assert json.loads(render(result, "json")) == {"run_id": EVIL_RUN}
    assert "\x1b" not in render(result, "json")


@pytest.fixture
def evil_run(daemon: InProcessDaemon) -> Iterator[InProcessDaemon]:
    """A run whose id, metric name, checkpoint path and crash message carry control sequences, stored, with its
    ``run_failed`` page."""
    import torch  # here, not at the top: collecting this module stays light

    agent = trainvigil.init(run_id=EVIL_RUN, nats_url=daemon.nats_url, flush_interval=0.05)
    for step in range(20):
        agent.log(step, loss=1.0 / (step + 1), **{EVIL_METRIC: float(step)})
    agent.checkpoint_saved(f"/ckpt/{TITLE}{CLEAR}.pt", {"w": torch.ones(8)}, step=19).result(timeout=30)
    agent.crashed(EVIL_CRASH)
    assert agent.close(timeout=30, status="error")
    wait_for(lambda: daemon.scalar("select count(*) from anomalies where detector = 'run_failed'") >= 1, 30, "a page")
    wait_for(lambda: daemon.scalar("select count(*) from checkpoints") >= 1, 30, "the checkpoint")
    yield daemon


def _stdout(daemon: InProcessDaemon, *args: str) -> str:
    """What ``vigil ARGS`` wrote to stdout, every byte as it came (text mode would turn a ``\\r`` into a newline)."""
    command = [sys.executable, "-m", "trainvigil.daemon.cli", *args, "--nats", daemon.nats_url]
    done = subprocess.run(command, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["alerts"],
        ["checkpoints"],
        ["sql", "select run_id, extra, * from steps"],
        ["sql", "select * from anomalies"],
        ["sql", "select * from runs"],
    ],
)
def test_the_cli_prints_no_escape_byte_from_an_agents_strings(evil_run: InProcessDaemon, command: list[str]) -> None:
    out = _stdout(evil_run, *command)
    assert terminal_safe("evil" + TITLE) in out, out  # the run is there, shown as text
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out and "\x9b" not in out


def test_vigil_report_prints_no_escape_byte(evil_run: InProcessDaemon) -> None:
    out = _stdout(evil_run, "report")
    assert "Health report" in out and "\x1b" not in out


def test_the_machine_formats_of_the_cli_keep_the_run_id_exact(evil_run: InProcessDaemon) -> None:
    lines = _stdout(evil_run, "runs", "--format", "json").splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [EVIL_RUN]
    rows = list(csv.DictReader(io.StringIO(_stdout(evil_run, "runs", "--format", "csv"), newline="")))
    assert [row["run_id"] for row in rows] == [EVIL_RUN]


def test_vigil_alerts_follow_prints_no_escape_byte(daemon: InProcessDaemon) -> None:
    command = [sys.executable, "-m", "trainvigil.daemon.cli", "alerts", "--follow", "--nats", daemon.nats_url]
    # Bytes: a text pipe would turn a \r into a line break.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as follow:
        assert follow.stderr is not None and follow.stdout is not None
        try:
            assert b"following" in follow.stderr.readline()  # subscribed: what comes next is seen
            agent = trainvigil.init(run_id=EVIL_RUN, nats_url=daemon.nats_url, flush_interval=0.05)
            agent.log(0, loss=1.0)
            agent.crashed(EVIL_CRASH)
            assert agent.close(timeout=30, status="error")
            line = follow.stdout.readline().decode()  # the page's update; a deadline: the pytest timeout
        finally:
            follow.terminate()
    assert "run_failed" in line and terminal_safe(EVIL_CRASH) in line, line
    assert "\x1b" not in line and "\x07" not in line and "\r" not in line and "\x9b" not in line
