"""A fleet of 512 ranks (8 runs x 64) against a real nats-server and a real daemon: the bench's simulation.

Every rank publishes one message a second with 10 steps, through JetStream with message ids, as
``bench/fleet.py`` does for ``ingest.py --fleet``. The ranks report a step time of 1.2 s (the
straggler detector's smallest window, 50 steps, then spans 5 s of this test), so simulated time
runs 12x faster than the wall clock here; the detectors judge steps and reported step times.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet import AlertWatch, Fleet, FleetSpec, StragglerVerdict, nan_latencies, straggler_verdict
from support import Daemon, NatsServer, wait_for

SPEC = FleetSpec(
    runs=8,
    ranks_per_run=64,
    producers=2,
    seconds=16.0,
    steps_per_message=10,
    step_time=1.2,
    straggler_at=3.0,
    nan_from=2.0,
    nan_every=2.0,
    prefix="fleet-test",
)


@pytest.mark.timeout(70)  # 512 publishing ranks and a daemon storing them: ~22 s
@pytest.mark.slow
def test_a_fleet_of_512_ranks_is_stored_whole_and_its_straggler_and_nans_are_named(
    nats_server: NatsServer, process_daemon: Daemon, tmp_path: Path
) -> None:
    """Every step of 512 ranks is stored once; the straggler is named within two windows; every NaN pages."""
    with AlertWatch(nats_server.url) as watch, Fleet(SPEC, nats_server.url, tmp_path) as fleet:
        fleet.start()
        fleet.go()
        wait_for(lambda: not fleet.running(), SPEC.seconds + 120, "the fleet to publish and be acknowledged", 0.2)
        reports = fleet.wait(30)
        steps = sum(r.steps for r in reports)
        assert steps == SPEC.ranks * SPEC.seconds * SPEC.steps_per_message / SPEC.interval
        wait_for(
            lambda: process_daemon.scalar("select count(*) from steps where run_id like 'fleet-test-%'") >= steps,
            120,
            "every step to be stored",
            0.5,
        )
        injected = sum(len(r.injections) for r in reports)
        wait_for(lambda: nan_latencies(reports, watch.alerts()).missed == 0, 30, "an alert for every NaN", 0.2)

        def named() -> StragglerVerdict | None:
            verdict = straggler_verdict(SPEC, reports, watch.alerts())
            return verdict if verdict is not None and verdict.named_step is not None else None

        verdict = wait_for(named, 30, "the straggler to be named", 0.2)
    rows = process_daemon.sql(
        "select count(*), count(distinct (run_id, rank, step)) from steps where run_id like 'fleet-test-%'"
    ).rows[0]
    assert tuple(rows) == (steps, steps)
    assert injected >= 5
    assert verdict.in_time, f"named {verdict.late_steps} steps late (deadline {verdict.deadline_steps})"
    assert verdict.others_named == 0, "no other rank is named a straggler"
    assert process_daemon.terminate() == 0


def test_a_fleet_message_is_what_the_agent_would_send_for_the_same_steps() -> None:
    """The simulated ranks build their columns with NumPy; the agent's own builder makes the same batch."""
    import numpy as np
    from fleet import ProducerReport, _Rank, step_message

    from trainvigil.agents.transport.columnar import build_step_batch
    from trainvigil.schemas import Envelope, StepBatch, decode

    spec = FleetSpec(runs=1, ranks_per_run=8, producers=1, nan_from=0.0, nan_every=1.0, straggler_at=0.0)
    report = ProducerReport(index=0, ranks=8)
    straggler = spec.straggler
    assert straggler is not None
    ranks = [_Rank(spec, g, "nonce", [0.0]) for g in (0, straggler)]
    for r in ranks:
        out = step_message(spec, r, 3, 1_700_000_010.0, 1_700_000_000.0, np.random.default_rng(1), report)
        envelope = decode(out.payload)
        assert isinstance(envelope, Envelope) and envelope.source == r.source
        (batch,) = envelope.records
        assert isinstance(batch, StepBatch)
        steps = np.frombuffer(batch.step, "<i8")
        times = np.frombuffer(batch.times, "<f8")
        columns = {name: np.frombuffer(col.values, "<f8") for name, col in batch.columns.items()}
        entries = [(int(s), float(t), {k: float(v[i]) for k, v in columns.items()}) for i, (s, t) in
                   enumerate(zip(steps, times, strict=True))]  # fmt: skip
        rebuilt, dropped = build_step_batch(entries, batch.time)
        assert rebuilt == batch and not dropped
        assert list(steps) == [12, 13, 14, 15] and np.isnan(columns["loss"][-1])  # the NaN on the last step
    assert report.straggler is not None and report.straggler[2] == 12 and len(report.injections) == 2
