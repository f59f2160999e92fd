"""``vigil bench-optim``: optimizers compared on the built-in workloads, each run watched and stored like any other.

Every (optimizer, workload, seed) is trained twice through an ordinary agent, as real runs of the
daemon at ``--nats`` (or of one started here, as ``vigil canary run`` does): at its LR
(``optim-<optimizer>-<workload>-s<seed>``) and at ``--unstable-factor`` x it (``...-x10``). The
second run is *stable* unless the daemon's own detectors page ``non_finite`` or ``loss_spike`` on
it (read back through SQL once the daemon stored its end). Each result is then published as an
``optim_result`` event of the benchmark's own run (``optim-bench-<id>``), which the daemon
materialises as a row of ``optim_results``; the command waits for those rows, then prints the
table (ranked by final loss, mean ± 95% interval over seeds, Welch's test against AdamW) and
writes the loss curves' PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainvigil.schemas.redact import redact_url

if TYPE_CHECKING:
    from trainvigil.daemon.cli.sqlclient import _Connection
    from trainvigil.optim.bench.run import RunRecord
    from trainvigil.optim.bench.specs import OptimizerSpec
    from trainvigil.schemas.optim import OptimResult

WORKLOAD_NAMES = ("supervised", "rl", "quadratic")
STEPS = {"supervised": 1500, "rl": 600, "quadratic": 1500}
QUICK_STEPS = {"supervised": 300, "rl": 120, "quadratic": 300}
SEEDS, QUICK_SEEDS = 3, 2
JUDGES = ("non_finite", "loss_spike")
"""The detectors whose page on the higher-LR run means unstable."""
STORED_S = 120.0
"""Seconds to wait for the daemon to store what was sent (each run's end, then the results)."""
POLL_S = 0.2

Ask = Callable[[str], list[list[Any]]]
"""A read-only query to the daemon; its rows."""


@dataclass
class Plan:
    specs: list[OptimizerSpec]
    workloads: list[str]
    seeds: int
    steps: dict[str, int]
    factor: float
    device: str = "cpu"
    agent: dict[str, Any] = field(default_factory=dict)


def plan(args: argparse.Namespace) -> Plan:
    """What to run, from the command line.

    Raises:
        SpecError: an optimizer cannot be loaded, or a flag is malformed.
    """
    from trainvigil.optim.bench import specs as s

    kwargs = s.parse_kwargs(args.kw)
    chosen = s.from_toml(args.optim_config) if args.optim_config else []
    chosen += [s.from_flag(target, kwargs, args.lr) for target in args.optim or []]
    if not chosen:
        chosen = list(s.BUILTINS.values())
    if s.BASELINE not in {c.name for c in chosen}:
        chosen.insert(0, s.BUILTINS[s.BASELINE])
    names = [c.name for c in chosen]
    if len(set(names)) < len(names):
        raise s.SpecError(f"two optimizers share a name ({names}): give them name = ... in --optim-config")
    workloads = args.workload or list(WORKLOAD_NAMES)
    steps = {w: args.steps or (QUICK_STEPS if args.quick else STEPS)[w] for w in workloads}
    seeds = args.seeds or (QUICK_SEEDS if args.quick else SEEDS)
    return Plan(chosen, workloads, seeds, steps, args.unstable_factor, args.device)


def _say(text: str) -> None:
    print(f"vigil: {text}", file=sys.stderr, flush=True)


def _ids(run_ids: list[str]) -> str:
    return ", ".join("'" + r.replace("'", "''") + "'" for r in run_ids)


def _wait(what: str, ready: Callable[[], bool]) -> None:
    """Until ``ready()``, for at most ``STORED_S`` seconds.

    Raises:
        DaemonUnavailableError: the daemon did not store it in time.
    """
    from trainvigil.errors import DaemonUnavailableError

    deadline = time.monotonic() + STORED_S
    while not ready():
        if time.monotonic() > deadline:
            raise DaemonUnavailableError(f"the daemon did not store {what} within {STORED_S:g} s")
        time.sleep(POLL_S)


def judge(run_ids: list[str], ask: Ask) -> dict[str, str]:
    """The runs the detectors found unstable, with the page that says so (``detector at step N``).

    Waits until the daemon stored each run's end: its steps are stored (and judged) by then.
    """
    if not run_ids:
        return {}
    ended = f"SELECT count(DISTINCT run_id) FROM events WHERE kind = 'run_end' AND run_id IN ({_ids(run_ids)})"
    _wait("the end of every stability run", lambda: ask(ended)[0][0] == len(run_ids))
    rows = ask(
        f"SELECT run_id, detector, min(step) AS step FROM anomalies WHERE run_id IN ({_ids(run_ids)}) "
        f"AND detector IN ({_ids(list(JUDGES))}) AND severity = 'page' GROUP BY ALL ORDER BY run_id, step"
    )
    pages: dict[str, str] = {}
    for run_id, detector, step in rows:
        pages.setdefault(str(run_id), f"{detector} at step {step}")
    return pages


def result(
    spec: OptimizerSpec,
    workload: str,
    seed: int,
    runs: tuple[RunRecord, RunRecord, float],
    page: str | None,
    bench: str,
) -> OptimResult:
    """The result of one (optimizer, workload, seed): ``runs`` are the run, its twin at a higher LR and that factor."""
    from trainvigil.optim.bench import stats
    from trainvigil.schemas.optim import OptimResult

    main, twin, factor = runs
    timed = main.timed
    return OptimResult(
        run_id=main.run_id, bench_id=bench, optimizer=spec.name, spec=spec.target, kwargs=json.dumps(spec.kwargs),
        workload=workload, seed=seed, lr=main.lr, steps=len(main.step_times),
        initial_loss=main.losses[0] if main.losses else None,
        final_loss=stats.final_loss(main.losses) if main.losses else None,
        steps_to_half=stats.steps_to_half(main.losses), step_time_mean_s=sum(timed) / len(timed),
        step_time_p95_s=stats.percentile(timed, 95), state_bytes=main.state_bytes, peak_bytes=main.peak_bytes,
        unstable_run_id=twin.run_id, unstable_lr_factor=factor,
        stable=page is None, unstable_reason=page or "",
    )  # fmt: skip


def execute(p: Plan, ask: Ask) -> tuple[list[OptimResult], dict[tuple[str, str], list[list[float]]]]:
    """Every run of the plan, judged, published and stored; the results and the loss curves."""
    import msgspec

    import trainvigil
    from trainvigil.optim.bench.run import run as train
    from trainvigil.schemas.optim import OPTIM_RESULT_EVENT

    bench = f"optim-bench-{uuid.uuid4().hex[:8]}"
    done: list[tuple[OptimizerSpec, str, int, RunRecord, RunRecord]] = []
    curves: dict[tuple[str, str], list[list[float]]] = {}
    for workload in p.workloads:
        for seed in range(p.seeds):
            for spec in p.specs:
                main = train(spec, workload, seed, p.steps[workload], agent_options=p.agent, device=p.device)
                twin = train(
                    spec, workload, seed, p.steps[workload], lr_factor=p.factor, agent_options=p.agent, device=p.device
                )
                done.append((spec, workload, seed, main, twin))
                curves.setdefault((workload, spec.name), []).append(main.losses)
                last = f"{main.losses[-1]:.4g}" if main.losses else "none"
                _say(f"{main.run_id}: {len(main.step_times)} steps, last loss {last}")
    pages = judge([twin.run_id for *_, twin in done], ask)
    results = [result(s, w, seed, (m, t, p.factor), pages.get(t.run_id), bench) for s, w, seed, m, t in done]
    config = {"optimizers": [s.name for s in p.specs], "workloads": p.workloads, "seeds": p.seeds}
    with trainvigil.init(run_id=bench, config=config | {"steps": p.steps}, **p.agent) as vigil:
        for r in results:
            vigil.event(OPTIM_RESULT_EVENT, **msgspec.structs.asdict(r))
    stored = f"SELECT count(*) FROM optim_results WHERE bench_id = '{bench}'"
    _wait("the results in optim_results", lambda: ask(stored)[0][0] >= len(results))
    _say(f"{len(results)} results stored in optim_results (bench_id = '{bench}')")
    return results, curves


def run(args: argparse.Namespace) -> int:
    """``vigil bench-optim`` (see the module's docstring); the exit status."""
    import anyio
    import anyio.from_thread
    import anyio.to_thread
    import msgspec

    from trainvigil.daemon.broker.bus import access
    from trainvigil.daemon.cli import _optim_report
    from trainvigil.daemon.cli._config import command_config
    from trainvigil.daemon.cli._with_daemon import with_daemon
    from trainvigil.daemon.cli.sqlclient import _ask
    from trainvigil.daemon.formatting import render
    from trainvigil.errors import ConfigError, QueryError
    from trainvigil.optim.bench.specs import BASELINE, SpecError
    from trainvigil.optim.bench.workloads import check_device
    from trainvigil.schemas.query import QueryRequest

    try:
        the_plan = plan(args)
        check_device(the_plan.device, the_plan.workloads)
    except SpecError as error:
        raise ConfigError(str(error), key="optim") from None
    except ValueError as error:  # check_device's
        raise ConfigError(str(error), key="device") from None
    if args.trace_memory:
        import tracemalloc

        # Once, before any thread starts: starting or stopping it while threads allocate crashes
        # CPython before 3.12.9 (gh-128679). Each run reads its own peak (tracemalloc.reset_peak).
        tracemalloc.start()
    cfg = command_config(args)
    agent = access(cfg, "agent")

    async def work(conn: _Connection, url: str) -> tuple[list[OptimResult], Any]:
        async def query(sql: str) -> list[list[Any]]:
            answer = await _ask(conn, url, QueryRequest(sql=sql), 30, cfg.subjects.query)
            if answer is None or answer.error:
                raise QueryError(
                    f"the daemon at {redact_url(url)} did not answer {sql!r}: {answer.error if answer else 'gone'}"
                )
            return answer.rows

        the_plan.agent = {
            "nats_url": url,
            "nats_creds": agent.creds,
            "nats_tls_ca": agent.tls_ca,
            "namespace": cfg.namespace,
        }
        return await anyio.to_thread.run_sync(execute, the_plan, lambda sql: anyio.from_thread.run(query, sql))

    results, curves = anyio.run(with_daemon, cfg, "daemon", work, backend="asyncio")
    if args.format == "json":
        sys.stdout.write("".join(json.dumps(msgspec.to_builtins(r)) + "\n" for r in results))
    else:
        sys.stdout.write(render(_optim_report.summary(results, BASELINE), "table"))
    if args.png:
        _say(_optim_report.plot(curves, Path(args.png)))
    return 0
