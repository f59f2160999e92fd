"""``flush_on_sigterm``: a run stopped with SIGTERM (preemption, scancel) delivers its last steps and says so.

Real processes, real signals: nats-server, ``vigil up`` and training scripts that are sent SIGTERM right
after logging, while their steps still wait for the next flush (1 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import Daemon, NatsServer, wait_for

from trainvigil.agents import _sigterm
from trainvigil.daemon.broker.embedded import free_port

N = 500
STUCK_AFTER_S = 1.0
"""The watcher's patience in the scripts stuck in C code: its default (5 s) only adds an idle wait."""

SCRIPT = """
import ctypes, os, signal, sys, time, trainvigil
vigil = trainvigil.init(run_id=sys.argv[1])
for step in range(int(sys.argv[3])):
    vigil.log(step, loss=1.0)
if sys.argv[2].startswith("stuck"):
    import trainvigil.agents._sigterm as sigterm
    sigterm.STUCK_AFTER_S = float(sys.argv[4])
if sys.argv[2] == "stuck, and so is a close hook":  # watch()'s last step, waiting behind that collective
    import threading
    vigil.before_close.append(threading.Event().wait)
    sigterm.CLOSE_WITHIN_S = 1.0
if sys.argv[2].startswith("stuck"):  # in C code that never returns, as a rank in a collective whose peer is gone
    signal.siginterrupt(signal.SIGTERM, False)  # the kernel restarts the read below after the C-level handler
    r, w = os.pipe()
    read, buffer = ctypes.CDLL(None).read, ctypes.create_string_buffer(1)
    print(f"ready {r}", flush=True)
    read(r, buffer, 1)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _terminated(url: str, run_id: str, mode: str, flush_on_sigterm: bool) -> tuple[int, float, str]:
    """Run the script until it logged N steps, SIGTERM it; its exit code, the seconds it took to exit, stderr."""
    env = {**os.environ, "VIGIL_NATS_URL": url, "VIGIL_FLUSH_ON_SIGTERM": "1" if flush_on_sigterm else "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, run_id, mode, str(N), str(STUCK_AFTER_S)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _sigterm_when_ready(proc)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        return proc.returncode, time.monotonic() - sent, err.decode()
    finally:
        proc.kill()
        proc.wait()


def _sigterm_when_ready(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the script once it says "ready"; when it names the fd its main thread will block reading, once
    it is blocked there: the signal must find it in the C call, not on its way there."""
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[:1] == [b"ready"], ready
    if len(ready) > 1:
        wait_for(lambda: _blocked_reading(proc.pid, int(ready[1])), 30, "the main thread to block in read()")
    proc.send_signal(signal.SIGTERM)


def _blocked_reading(pid: int, fd: int) -> bool:
    """The process's main thread sleeps in a system call on ``fd`` (Linux's /proc)."""
    task = Path(f"/proc/{pid}/task/{pid}")
    syscall = (task / "syscall").read_text().split()
    return (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "S" and syscall[1:2] == [hex(fd)]


@pytest.mark.parametrize("mode", ["python", "stuck"])
def test_sigterm_with_flush_on_sigterm_delivers_every_step_and_ends_the_run_on_sigterm(
    nats_server: NatsServer, tmp_path: Path, mode: str
) -> None:
    """In Python the handler exits at once; stuck in C code (the handler cannot run), the watcher thread
    closes the agent and exits STUCK_AFTER_S later (without it, the process would never end)."""
    daemon = Daemon(nats_server.url, tmp_path / "data")
    daemon.start()
    try:
        code, took, err = _terminated(nats_server.url, mode, mode, flush_on_sigterm=True)
        assert code == 128 + signal.SIGTERM, err
        if mode == "stuck":
            assert STUCK_AFTER_S <= took < 40, err
            assert "has not come back to Python" in err, err
        rows = f"select count(*) from steps where run_id = '{mode}'"
        wait_for(lambda: daemon.scalar(rows) == N, 30, f"{N} steps")
        wait_for(lambda: daemon.scalar(f"select status from runs where run_id = '{mode}'") == "error", 30, "run_end")
        page = f"select message from anomalies where detector = 'run_failed' and run_id = '{mode}'"
        message = wait_for(lambda: daemon.sql(page).rows, 30, "run_failed")[0][0]
        assert "SIGTERM" in message, message
    finally:
        daemon.kill()


def test_a_rank_stuck_in_c_code_ends_even_when_closing_its_agent_hangs_too() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    code, took, err = _terminated(url, "hung-close", "stuck, and so is a close hook", flush_on_sigterm=True)
    assert code == 128 + signal.SIGTERM, err
    assert STUCK_AFTER_S + 1.0 <= took < STUCK_AFTER_S + _sigterm.CLOSE_WITHIN_S, err


TAKEN_OVER = """
import ctypes, os, signal, sys, time, trainvigil
import trainvigil.agents._sigterm as sigterm
sigterm.STUCK_AFTER_S = 0.2
vigil = trainvigil.init(run_id="later", flush_on_sigterm=True)
signal.signal(signal.SIGTERM, lambda *_: print("theirs", flush=True))  # as Lightning's SLURM handler, after init()
signal.siginterrupt(signal.SIGTERM, False)
r, w = os.pipe()
read, buffer = ctypes.CDLL(None).read, ctypes.create_string_buffer(1)
print(f"ready {r}", flush=True)
read(r, buffer, 1)  # a long C call: the framework's handler runs once it returns
"""


def test_a_handler_set_after_init_owns_sigterm_and_the_watcher_never_ends_the_process() -> None:
    env = {**os.environ, "VIGIL_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
    proc = subprocess.Popen([sys.executable, "-c", TAKEN_OVER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _sigterm_when_ready(proc)
        with pytest.raises(subprocess.TimeoutExpired):  # ten times the watcher's patience, shortened to 0.2 s
            proc.wait(2.0)
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_without_flush_on_sigterm_sigterm_keeps_its_default_action() -> None:
    code, _, err = _terminated(f"nats://127.0.0.1:{free_port()}", "default", "python", flush_on_sigterm=False)
    assert code == -signal.SIGTERM, err


HANDLERS = """
import os, signal, sys, trainvigil
if sys.argv[1] == "own":
    signal.signal(signal.SIGTERM, lambda *_: None)
own = signal.getsignal(signal.SIGTERM)
vigil = trainvigil.init(run_id="h", flush_on_sigterm=True)
print("kept" if signal.getsignal(signal.SIGTERM) is own else "replaced", flush=True)
pid = os.fork()
if pid == 0:  # a DataLoader worker: SIGTERM is its own again, and writes to no pipe of its parent
    ok = signal.getsignal(signal.SIGTERM) is own and signal.set_wakeup_fd(-1) == -1
    print("child as before init()" if ok else "child inherited the agent's", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
vigil.close(timeout=0.1)
"""


@pytest.mark.parametrize(("handler", "expected"), [("own", "kept"), ("none", "replaced")])
def test_a_scripts_own_sigterm_handler_is_left_alone_and_a_forked_child_gets_the_default_back(
    handler: str, expected: str
) -> None:
    env = {**os.environ, "VIGIL_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
    out = subprocess.run([sys.executable, "-c", HANDLERS, handler], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == [expected, "child as before init()"], out.stderr
