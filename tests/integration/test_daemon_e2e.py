"""The daemon's edges against a real broker: dead letters, read-only SQL from the CLI, HTTP."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import msgspec
import nats
from inprocess import InProcessDaemon
from support import Daemon, NatsServer, finish, run_producer, vigil_together, wait_for

from trainvigil.schemas import Envelope, RunEvent, Source, encode


async def _publish(url: str, items: list[tuple[str, bytes]]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for subject, payload in items:
        await js.publish(subject, payload)
    await nc.close()


def _good(run_id: str) -> bytes:
    return encode(Envelope(source=Source(run_id=run_id), seq=1, records=[RunEvent(time=1.0, kind="ok")]))


def test_bad_messages_become_dead_letters_and_ingest_goes_on(
    process_daemon: Daemon, private_nats_server: NatsServer
) -> None:
    good = msgspec.msgpack.decode(_good("dl"))
    wrong_version = msgspec.msgpack.encode({**good, "v": 2})
    truncated = _good("dl")[:-7]
    garbage = b"\x00\xffnot msgpack at all"
    asyncio.run(
        _publish(
            private_nats_server.url,
            [
                ("vigil.v1.dl.metrics", garbage),
                ("vigil.v1.dl.run", wrong_version),
                ("vigil.v1.dl.run", truncated),
                ("vigil.v1.dl.run", _good("dl")),
            ],
        )
    )
    wait_for(
        lambda: process_daemon.scalar("select count(*) from events where run_id = 'dl' and kind = 'ok'") == 1,
        30,
        "the good message after the bad ones",
    )
    rows = process_daemon.sql(
        "select subject, reason, error, octet_length(raw) from dead_letters order by stream_seq"
    ).rows
    assert len(rows) == 3, rows
    assert [r[0] for r in rows] == ["vigil.v1.dl.metrics", "vigil.v1.dl.run", "vigil.v1.dl.run"]
    assert rows[1][1] == "schema_version" and "2" in rows[1][2]
    assert all(r[1] and r[2] for r in rows), "every dead letter has a reason and an error text"
    assert [r[3] for r in rows] == [len(garbage), len(wrong_version), len(truncated)], "raw bytes are kept whole"
    assert process_daemon.process is not None and process_daemon.process.poll() is None, "the daemon keeps running"


def test_vigil_sql_refuses_writes_and_file_access(
    daemon: InProcessDaemon, nats_server: NatsServer, tmp_path: object
) -> None:
    proc = run_producer(nats_server.url, "ro", 0, 100)
    finish(proc)
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'ro'") == 100, 30, "100 rows")
    target = f"{tmp_path}/x.csv"
    writes = [
        "delete from steps",
        f"copy steps to '{target}'",
        "select * from read_csv('/etc/passwd')",
        "attach '/tmp/other.duckdb'",
        "install httpfs",
        "drop table steps",
    ]
    refused = vigil_together(*[["sql", sql, "--nats", nats_server.url] for sql in writes], timeout=60)
    for sql, result in zip(writes, refused, strict=True):
        assert result.returncode == 1, (sql, result.stdout, result.stderr)
        assert "refused" in result.stderr, result.stderr
    assert daemon.scalar("select count(*) from steps where run_id = 'ro'") == 100
    assert not __import__("os").path.exists(target)

    ok, runs = vigil_together(
        ["sql", "select run_id, count(*) as n from steps group by 1", "--nats", nats_server.url, "--format", "csv"],
        ["runs", "--nats", nats_server.url, "--format", "json"],
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == ["run_id,n", "ro,100"]
    assert runs.returncode == 0, runs.stderr
    row = msgspec.json.decode(runs.stdout.splitlines()[0])
    assert row["run_id"] == "ro" and row["steps"] == 100 and row["last_step"] == 99 and row["status"] == "ok"


def test_vigil_sql_reads_the_file_when_no_daemon_runs(daemon: InProcessDaemon, private_nats_server: NatsServer) -> None:
    proc = run_producer(private_nats_server.url, "offline", 0, 50)
    finish(proc)
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'offline'") == 50, 30, "50 rows")
    assert daemon.terminate() == 0
    private_nats_server.stop()
    where = ["--nats", private_nats_server.url, "--data-dir", str(daemon.data_dir)]
    # Side by side: each reads the file read-only (DuckDB lets several processes share a read-only open).
    result, refused = vigil_together(
        ["sql", "select count(*) from steps", *where, "--format", "csv"],
        ["sql", "delete from steps", *where],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "50"
    assert refused.returncode == 1


def test_healthz_and_metrics(daemon: InProcessDaemon, nats_server: NatsServer) -> None:
    proc = run_producer(nats_server.url, "http", 0, 300)
    finish(proc)
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'http'") == 300, 30, "300 rows")
    base = f"http://127.0.0.1:{daemon.http_port}"
    with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
        assert resp.status == 200
        assert msgspec.json.decode(resp.read())["status"] == "ok"

    def steps_metric() -> float:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith('vigil_events_ingested_total{kind="steps"}'):
                return float(line.split()[-1])
        return 0.0

    assert wait_for(lambda: steps_metric() >= 300, 10, "steps in /metrics")
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for name in ["vigil_consumer_lag", "vigil_dead_letters_total", "vigil_batch_write_seconds_bucket"]:
        assert name in text
    try:
        urllib.request.urlopen(base + "/nope", timeout=5)
        raise AssertionError("expected 404")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404


def test_cli_help_and_exit_codes() -> None:
    helps = [["--help"], ["up", "--help"], ["sql", "--help"], ["runs", "--help"], ["demo", "--help"]]
    *helped, bare, bad = vigil_together(*helps, [], ["up", "--config", "/nonexistent.toml"], timeout=60)
    for args, result in zip(helps, helped, strict=True):
        assert result.returncode == 0 and "usage" in result.stdout, args
    assert bare.returncode == 2
    assert bad.returncode == 2 and "does not exist" in bad.stderr
