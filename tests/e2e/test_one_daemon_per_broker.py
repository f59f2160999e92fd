"""One daemon per broker: a second `vigil up` on the same stream and consumer refuses to start.

Real processes: one nats-server, daemons on different data directories, training processes and the CLI.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import urllib.request
from pathlib import Path

import nats
from nats.aio.msg import Msg
from support import Daemon, NatsServer, finish, run_producer, vigil, wait_for

from trainvigil.daemon.broker.holders import Holder, unsharded_holder
from trainvigil.schemas import DEFAULT_SUBJECTS

EXIT_USAGE = 2
REFUSED = 'vigil_replies_refused_total{responder="holders"}'


def _refusal(daemon: Daemon) -> tuple[int, str]:
    """The exit code and output of a daemon that must refuse to start (it must not keep running)."""
    assert daemon.process is not None
    try:
        code = daemon.process.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the second daemon kept running: {daemon.log.read_text()[-2000:]}") from None
    return code, daemon.log.read_text()


def _stop(*daemons: Daemon) -> None:
    for d in daemons:
        if d.process is not None and d.process.poll() is None:
            d.kill()


def test_a_second_daemon_on_the_same_broker_refuses_and_the_first_keeps_its_consumer(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    first = Daemon(nats_server.url, tmp_path / "first")
    second = Daemon(nats_server.url, tmp_path / "second")
    first.start()
    try:
        second.launch()
        code, out = _refusal(second)
        assert code == EXIT_USAGE, out
        refusal = [line for line in out.splitlines() if line.startswith("vigil: ")]
        assert len(refusal) == 1, out
        assert str((tmp_path / "first").resolve()) in refusal[0], refusal
        assert "one daemon per broker" in refusal[0] and "--shard" in refusal[0], refusal

        finish(run_producer(nats_server.url, "after-refusal", 0, 50))
        wait_for(
            lambda: first.scalar("select count(*) from steps where run_id = 'after-refusal'") == 50,
            30,
            "the first daemon to store every step logged after the refusal",
        )
        assert first.scalar("select count(*) from data_loss") == 0
        assert first.scalar("select count(*) from anomalies where detector = 'data_loss'") == 0
    finally:
        _stop(first, second)


def test_daemons_started_together_on_one_broker_leave_exactly_one_running(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    daemons = [Daemon(nats_server.url, tmp_path / f"d{i}") for i in range(2)]
    for d in daemons:
        d.launch()
    try:
        exited = wait_for(
            lambda: [d for d in daemons if d.process is not None and d.process.poll() is not None],
            60,
            "one of the two daemons to refuse",
        )
        assert len(exited) == 1, [d.log.read_text()[-1000:] for d in daemons]
        (left,) = (d for d in daemons if d not in exited)
        assert exited[0].process is not None and exited[0].process.returncode == EXIT_USAGE
        assert str(left.data_dir.resolve()) in exited[0].log.read_text()
        left.wait_ready()
        finish(run_producer(nats_server.url, "together", 0, 20))
        wait_for(lambda: left.scalar("select count(*) from steps where run_id = 'together'") == 20, 30, "the steps")
    finally:
        _stop(*daemons)


def test_a_daemon_that_missed_the_question_while_paused_makes_the_later_one_stop(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The first daemon is stopped (SIGSTOP) while the second starts, so the second finds nobody; once the
    first runs again, asking again finds both, and the later one stops with the refusal."""
    first = Daemon(nats_server.url, tmp_path / "first")
    second = Daemon(nats_server.url, tmp_path / "second")
    first.start()
    assert first.process is not None
    try:
        first.process.send_signal(signal.SIGSTOP)
        try:
            second.launch()  # ready by its log: queries may go to the paused one
            wait_for(lambda: "daemon ready" in second.log.read_text(), 30, "the second daemon to start")
        finally:
            first.process.send_signal(signal.SIGCONT)
        code, out = _refusal(second)
        assert code == EXIT_USAGE, out
        said = [line for line in out.splitlines() if line.startswith("vigil: ") and "stopping" in line]
        assert len(said) == 1 and str(first.data_dir.resolve()) in said[0], out
        finish(run_producer(nats_server.url, "after-both", 0, 20))
        wait_for(lambda: first.scalar("select count(*) from steps where run_id = 'after-both'") == 20, 30, "steps")
        assert first.scalar("select count(*) from data_loss") == 0
    finally:
        _stop(first, second)


def test_a_sigkilled_daemon_does_not_block_its_restart(nats_server: NatsServer, tmp_path: Path) -> None:
    first = Daemon(nats_server.url, tmp_path / "data")
    first.start()
    first.kill()
    again = Daemon(nats_server.url, tmp_path / "data")
    try:
        again.start()  # within wait_ready's deadline, not after a lock's time to live
        finish(run_producer(nats_server.url, "restarted", 0, 20))
        wait_for(lambda: again.scalar("select count(*) from steps where run_id = 'restarted'") == 20, 30, "the steps")
    finally:
        _stop(again)


def test_sql_with_another_data_dir_says_which_daemon_answered(nats_server: NatsServer, tmp_path: Path) -> None:
    serving = Daemon(nats_server.url, tmp_path / "serving")
    asked = tmp_path / "asked"
    # A history of its own at the asked directory: the daemon stopped, its file left behind.
    own = Daemon(nats_server.url, asked)
    own.start()
    assert own.terminate() == 0
    serving.start()
    try:
        done = vigil("sql", "select 1", "--nats", nats_server.url, "--data-dir", str(asked), "--format", "csv")
        assert done.returncode == 0, done.stderr
        said = [line for line in done.stderr.splitlines() if str(asked.resolve()) in line]
        assert len(said) == 1, done.stderr
        assert str((tmp_path / "serving").resolve()) in said[0], said

        mine = vigil("sql", "select 1", "--nats", nats_server.url, "--data-dir", str(serving.data_dir))
        assert mine.returncode == 0, mine.stderr
        assert "serving" not in mine.stderr, "no warning when the asked data dir is the daemon's"
    finally:
        _stop(serving)


def test_who_holds_the_consumer_is_answered_in_inboxes_only(daemon: Daemon) -> None:
    """A request whose reply names a stream subject gets nothing published there (counted as refused); an
    inbox gets the daemon's name, with its data dir."""

    async def ask() -> tuple[list[Msg], Holder | None]:
        nc = await nats.connect(daemon.nats_url)
        try:
            seen: list[Msg] = []

            async def into_stream(msg: Msg) -> None:
                seen.append(msg)

            victim = await nc.subscribe("vigil.v1.victim.metrics", cb=into_stream)
            await nc.publish(DEFAULT_SUBJECTS.holders, b"", reply="vigil.v1.victim.metrics")
            holder = await unsharded_holder(nc, look_s=5)
            await nc.flush()
            await victim.unsubscribe()
            return seen, holder
        finally:
            await nc.close()

    seen, holder = asyncio.run(ask())
    assert seen == []
    assert holder is not None and holder.data_dir == str(daemon.data_dir.resolve()) and holder.holding
    wait_for(lambda: _refused(daemon) >= 1, 10, "the refused reply to be counted")


def _refused(daemon: Daemon) -> float:
    url = f"http://127.0.0.1:{daemon.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(REFUSED))
