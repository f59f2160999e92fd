"""The CLI checks what it is given before it acts, says which valid value was meant, and every
command's ``--help`` (and the docs' CLI reference) lists its exit codes from one table."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from docs_gen import load_reference
from support import vigil_together

from trainvigil.daemon.cli import _exits
from trainvigil.daemon.cli.main import build_parser

reference = load_reference()

GUARD_S = 60.0
"""A refused argument needs no broker, daemon or network: far less than a daemon's start, even loaded."""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _vigil_in(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``vigil ARGS`` run in ``cwd``, away from any broker on the default port, and how long it took."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env |= {"VIGIL_EMBEDDED_PORT": str(_closed_port()), "VIGIL_CONNECT_TIMEOUT_S": "2"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=GUARD_S,
    )
    return done, time.monotonic() - started


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of this machine's processes that name ``text`` (a daemon's or nats-server's store dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["canary", "run", "--fault", "nan_gard"], "nan_grad"),
        (["canary", "run", "--fault", "nan_grad", "--workload", "supervsied"], "supervised"),
        (["canary", "run", "--all", "--workload", "two_rnak"], "two_rank"),
    ],
)
def test_canary_run_refuses_a_typo_before_starting_anything(tmp_path: Path, argv: list[str], suggested: str) -> None:
    """A misspelt fault or workload exits 2 with the closest valid value, and no data directory, daemon or
    broker was started for it (the cwd stays empty)."""
    done, took = _vigil_in(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert f"did you mean '{suggested}'?" in done.stderr
    assert "started a daemon" not in done.stderr
    assert list(tmp_path.iterdir()) == [], "the refused command created files"
    assert not _processes_mentioning(str(tmp_path)), "a process was left running on the cwd"
    assert took < GUARD_S
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    ("argv", "named", "suggested"),
    [
        (["replay", "r.csv", "--format", "cvs"], "--format", "csv"),
        (["sql", "select 1", "--format", "jsn"], "--format", "json"),
        (["export", "run", "--table", "step"], "--table", "steps"),
        (["bench-optim", "--workload", "quadratik"], "--workload", "quadratic"),
    ],
)
def test_a_mistyped_choice_suggests_the_closest(tmp_path: Path, argv: list[str], named: str, suggested: str) -> None:
    """A value outside a flag's closed set is a usage error naming the flag and the valid value meant."""
    done, _ = _vigil_in(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert f"did you mean '{suggested}'?" in done.stderr
    assert list(tmp_path.iterdir()) == []


def _commands() -> list[str]:
    return [name for name, _, _ in reference.commands(build_parser())]


def test_the_table_covers_every_command_and_no_other() -> None:
    """Each command of the parser has its row of exit codes; the table names no command that is gone."""
    assert len(_commands()) >= 20
    assert set(_commands()) == set(_exits.COMMANDS)
    for codes in _exits.COMMANDS.values():
        assert set(codes) <= set(_exits.MEANINGS)
        assert 2 in codes, "every command can fail argparse's check: 2 is always among its codes"


def _exit_section(text: str) -> str:
    _, found, section = text.partition("exit codes:\n")
    assert found, text
    return section


def test_every_command_help_lists_its_exit_codes() -> None:
    """``vigil CMD --help`` ends with an ``exit codes:`` block: one line per code the table gives for CMD."""
    commands = _commands()
    helps = vigil_together(*[[*name.split()[1:], "--help"] for name in commands])
    for name, done in zip(commands, helps, strict=True):
        assert done.returncode == 0, f"{name}: {done.stderr}"
        section = _exit_section(done.stdout)
        for code, what in _exits.codes(name).items():
            assert re.search(rf"^  {code}  {re.escape(what.split()[0])}", section, re.M), f"{name}: {code}"
        listed = {int(m) for m in re.findall(r"^  (\d)  ", section, re.M)}
        assert listed == set(_exits.codes(name)), name


def test_top_level_help_lists_every_code() -> None:
    done = vigil_together(["--help"])[0]
    section = _exit_section(done.stdout)
    assert {int(m) for m in re.findall(r"^  (\d)  ", section, re.M)} == set(_exits.MEANINGS)


def test_up_help_describes_the_web_view() -> None:
    """``vigil up --help`` says where the web view and its endpoints are, and how to move or turn them off."""
    done = vigil_together(["up", "--help"])[0]
    text = " ".join(done.stdout.split())
    assert "web view" in text
    for what in ("--http-host", "--http-port", "/metrics", "/healthz", "http://127.0.0.1:9464/", "0 = off"):
        assert what in text, what


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["sql", "--bogus"], "usage: vigil sql"),
        (["sql", "select 1", "--bogus"], "usage: vigil sql"),
        (["canary", "run", "--fault", "nan_grad", "--bogus"], "usage: vigil canary run"),
        (["shards", "which", "r", "2", "--bogus"], "usage: vigil shards which"),
    ],
)
def test_an_unknown_flag_prints_the_usage_of_its_command(tmp_path: Path, argv: list[str], usage: str) -> None:
    """The usage shown is the command's that was given the flag, and the error names the flag."""
    done, _ = _vigil_in(tmp_path, *argv)
    assert done.returncode == 2
    assert done.stderr.startswith(usage), done.stderr
    assert "unrecognized arguments: --bogus" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_cli_reference_lists_each_commands_exit_codes() -> None:
    """The generated CLI page shows, under each command, the codes of the same table."""
    page = reference.cli_page()
    sections = re.split(r"^## ", page, flags=re.M)
    by_command = {s.split("`")[1]: s for s in sections if s.startswith("`vigil")}
    assert set(by_command) == set(_exits.COMMANDS)
    for name, section in by_command.items():
        for code, what in _exits.codes(name).items():
            assert f"| {code} | {reference.markdown(what)} |" in section, f"{name}: {code}"
    for code, (constant, meaning) in _exits.MEANINGS.items():
        assert f"| {code} | `{constant}` | {meaning} |" in page


@pytest.mark.parametrize(
    ("toml", "suggested"),
    [
        ("[detectors.loss_spkie]\nenabled = false\n", "loss_spike"),
        ("[detectors.loss_spike]\nenabeld = false\n", "enabled"),
        ("[canary]\nconcurency = 1\n", "concurrency"),
    ],
)
def test_a_mistyped_settings_key_suggests_the_closest(tmp_path: Path, toml: str, suggested: str) -> None:
    """A detector's name (or any key) misspelt in ``--config`` is refused naming the key it was meant to be."""
    (tmp_path / "vigil.toml").write_text(toml)
    (tmp_path / "r.csv").write_text("run_id,rank,step,loss\nr,0,1,1.0\n")
    done, _ = _vigil_in(tmp_path, "replay", "r.csv", "--config", "vigil.toml")
    assert done.returncode == 2, done.stderr
    assert f"did you mean '{suggested}'?" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
