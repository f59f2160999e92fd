"""``vigil demo``: embedded broker + daemon + a real training subprocess, then SQL answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import anyio

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.daemon.cli.sqlclient import ask_daemon
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.formatting import render
from trainvigil.daemon.logs import configure
from trainvigil.schemas.query import QueryRequest, QueryResult

QUESTIONS = [
    ("Runs", "select run_id, status, world_size, first_seen, last_seen from runs"),
    ("Steps per run", "select run_id, rank, count(*) as steps, max(step) as last_step from steps group by all"),
    (
        "Loss, first vs last 50 steps",
        "select (step >= (select max(step) from steps) - 49) as late, round(avg(loss), 4) as mean_loss, "
        "round(avg(step_time) * 1000, 3) as mean_step_ms from steps "
        "where step < 50 or step >= (select max(step) from steps) - 49 group by 1 order by 1",
    ),
    ("Run events", "select kind, step, fields from events order by time"),
    (
        "Alerts (one corrupt batch was fed on purpose)",
        "select detector, severity, state, step, round(value, 3) as value, message from anomalies order by time",
    ),
]


async def _ask_ok(url: str, sql: str) -> QueryResult:
    result = await ask_daemon(url, QueryRequest(sql=sql), timeout=30)
    if result is None or result.error:
        raise RuntimeError(f"demo query failed: {None if result is None else result.error}")
    return result


async def _demo(steps: int, data_dir: str) -> None:
    from trainvigil.daemon.app import serve

    config = DaemonConfig(
        data_dir=data_dir, embedded_port=free_port(), http_port=free_port(), log_format="console", log_level="warning"
    )
    async with anyio.create_task_group() as tg:
        url: str = await tg.start(serve, config)
        print(f"[demo] broker {url}, daemon on {data_dir}; training {steps} steps...", flush=True)
        # The demo's daemon serves the default namespace: a VIGIL_NAMESPACE of the shell would send its steps elsewhere.
        inherited = {k: v for k, v in os.environ.items() if k != "VIGIL_NAMESPACE"}
        env = {**inherited, "VIGIL_NATS_URL": url, "VIGIL_RUN_ID": "demo"}
        started = time.perf_counter()
        await anyio.run_process(
            [
                sys.executable,
                "-m",
                "trainvigil.daemon.cli.demo_train",
                "--steps",
                str(steps),
                "--spike-at",
                str(steps * 2 // 3),
            ],
            env=env,
            stdout=None,
            stderr=None,
            check=True,
        )
        print(f"[demo] training finished in {time.perf_counter() - started:.1f} s", flush=True)
        with anyio.fail_after(60):
            while True:
                count = (await _ask_ok(url, "select count(*) from steps where run_id = 'demo'")).rows[0][0]
                if count >= steps:
                    break
                await anyio.sleep(0.1)
        print(f"[demo] all {steps} steps are in DuckDB; some SQL answers:\n", flush=True)
        for title, sql in QUESTIONS:
            print(f'-- {title}\n-- vigil sql "{sql}"')
            print(render(await _ask_ok(url, sql), "table"), flush=True)
        tg.cancel_scope.cancel()


def run_demo(steps: int = 300, keep: bool = False) -> int:
    configure("console", "warning")
    data_dir = tempfile.mkdtemp(prefix="vigil-demo-")
    try:
        anyio.run(_demo, steps, data_dir, backend="asyncio")
    except subprocess.CalledProcessError as exc:
        print(f"[demo] the training script failed with exit code {exc.returncode}", file=sys.stderr)
        return 1
    finally:
        if keep:
            print(f'[demo] data kept in {data_dir}; query it with: vigil sql --data-dir {data_dir} "..."')
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0
