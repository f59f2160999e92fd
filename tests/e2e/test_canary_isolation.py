"""A canary job imports nothing from where the daemon runs: modules planted in its working directory never run.

The daemon runs as an operator starts it, the ``vigil`` console script in a directory of their choice (the
script's own folder is on its import path, not the working directory). A built-in canary workload is
``python -m trainvigil.canary.<name>``, which would put the job's working directory first on its import
path: a ``torch.py`` there would run, as the daemon's user, at every canary.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer, vigil, wait_for

PLANTED = ("torch", "trainvigil", "numpy")
"""Modules every workload imports, planted in the daemon's working directory."""


class _ConsoleDaemon(Daemon):
    """``vigil up`` through its console script, started in ``cwd``."""

    def __init__(self, nats_url: str, data_dir: Path, cwd: Path, *extra: str, env: dict[str, str]) -> None:
        super().__init__(nats_url, data_dir, *extra, env=env)
        self.cwd = cwd

    def launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [str(Path(sys.executable).with_name("vigil")), "up", *self.broker_args()]
        command += ["--data-dir", str(self.data_dir), "--http-port", str(self.http_port), *self.extra]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=log, cwd=self.cwd, env={**os.environ, **self.env}
            )  # fmt: skip


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A working directory holding a ``torch.py``, ``trainvigil.py`` and ``numpy.py`` that leave a mark when run."""
    where = tmp_path / "workdir"
    where.mkdir()
    for name in PLANTED:
        (where / f"{name}.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'a').write({name!r} + '\\n')\n")
    return where


JOB = "import os; open(os.environ['PROBE'], 'w').write(os.getcwd())"
"""A configured job that writes down its working directory."""


@pytest.fixture
def console_daemon(nats_server: NatsServer, tmp_path: Path, planted: Path) -> Iterator[_ConsoleDaemon]:
    script = tmp_path / "where.py"
    script.write_text(JOB)
    config = tmp_path / "vigil.toml"
    jobs = f'[[canary.jobs]]\nname = "where"\ncommand = "python {script}"\n'
    config.write_text(f"{jobs}[canary.jobs.env]\nPROBE = {json.dumps(str(tmp_path / 'probe'))}\n")
    # A faulted job is stopped 1 s after its page; the configured job sends no run_end to wait for, so it is
    # judged 1 s after it exited rather than the default 30 s (its verdict is not what these tests check).
    d = _ConsoleDaemon(nats_server.url, tmp_path / "data", planted, "--config", str(config),
                       env={"VIGIL_CANARY_LINGER_S": "1", "VIGIL_CANARY_SETTLE_S": "1"})  # fmt: skip
    d.start()
    yield d
    if d.process is not None and d.process.poll() is None:
        d.terminate()


def _canary(d: _ConsoleDaemon, nats_url: str, *args: str) -> list[str]:
    return ["canary", "run", *args, "--nats", nats_url, "--data-dir", str(d.data_dir), "--format", "json"]


def test_a_canary_never_imports_modules_planted_in_the_daemons_working_directory_and_still_passes(
    console_daemon: _ConsoleDaemon, nats_server: NatsServer, tmp_path: Path
) -> None:
    done = vigil(*_canary(console_daemon, nats_server.url, "--fault", "nan_grad", "--steps", "20000",
                          "--fault-step", "100"))  # fmt: skip
    marks = (tmp_path / "ran").read_text().split() if (tmp_path / "ran").exists() else []
    assert marks == [], f"planted modules ran in the canary job: {marks}"
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["verdict"], result["fired_detector"]) == ("pass", "non_finite"), result


def _job_pid(d: _ConsoleDaemon) -> int | None:
    for line in d.log.read_text().splitlines():
        if '"canary_process"' in line:
            return int(json.loads(line)["pid"])
    return None


@pytest.mark.timeout(110)  # a daemon and a canary job stopped once caught: ~12 s
def test_a_workload_runs_in_a_private_directory_of_its_own_removed_once_it_ended(
    console_daemon: _ConsoleDaemon, nats_server: NatsServer
) -> None:
    # The job lives for its torch import, 100 steps and linger_s after the page: seconds to read its cwd in. A
    # later fault only gives a busy machine's slowdown detector the time to warn before it, which fails the canary.
    command = [sys.executable, "-m", "trainvigil.daemon.cli"]
    command += _canary(console_daemon, nats_server.url, "--fault", "nan_grad", "--steps", "20000",
                       "--fault-step", "100")  # fmt: skip
    trigger = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _job_pid(console_daemon) is not None, 60, "the canary job to start")
        pid = _job_pid(console_daemon)
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        info = cwd.stat()
        assert cwd != console_daemon.cwd and (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.getuid())
        out, err = trigger.communicate(timeout=180)
    finally:
        if trigger.poll() is None:
            trigger.kill()
            trigger.communicate()
    assert trigger.returncode == 0, err
    assert json.loads(out)["verdict"] == "pass"
    assert not cwd.exists(), "the private directory is removed with the job"


@pytest.mark.timeout(110)  # a daemon and a configured job judged settle_s (1 s) after it exited: ~5 s
def test_a_configured_job_without_a_cwd_keeps_the_daemons_working_directory(
    console_daemon: _ConsoleDaemon, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Its command line is the operator's and may name files relative to where the daemon runs."""
    done = vigil(*_canary(console_daemon, nats_server.url, "--fault", "none", "--workload", "where"))
    assert (tmp_path / "probe").exists(), done.stderr
    assert Path((tmp_path / "probe").read_text()) == console_daemon.cwd.resolve()
