"""``ingest.py --fleet``: a fleet of simulated ranks (``fleet.py``) against one live daemon, as a report."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _procs import (
    COMMITS_SERIES,
    LAG_SERIES,
    Services,
    cpu_seconds,
    log_events,
    machine_cpu,
    shut_down,
    start_services,
    stored_rows,
)
from fleet import (
    AlertWatch,
    Fleet,
    FleetSpec,
    NanLatency,
    ProducerReport,
    StragglerVerdict,
    nan_latencies,
    straggler_verdict,
)
from tables import table

from trainvigil.schemas import Anomaly
from trainvigil.testing import STEPS_SERIES, memory_mib, scrape


@dataclass(frozen=True)
class Sample:
    t: float
    """Seconds after the fleet's start."""
    lag: int
    committed: int
    daemon_cpu: float
    """Share of one core since the previous sample."""
    daemon_rss_mib: float
    nats_cpu: float
    producers_cpu: float
    machine_busy: float
    """Share of all the machine's CPUs busy (any process)."""
    machine_iowait: float
    commits: int
    """The daemon's transactions so far."""


@dataclass(frozen=True)
class FleetReport:
    spec: FleetSpec
    producers: list[ProducerReport]
    samples: list[Sample]
    alerts: list[tuple[float, Anomaly]]
    straggler: StragglerVerdict | None
    nan: NanLatency
    caught_up_s: float
    """From the fleet's last publish to the daemon committing the last step."""
    cpu: dict[str, float]
    """CPU seconds per process group from go to the last commit."""
    wall_s: float
    peak_rss_mib: float
    rows: int
    distinct: int
    log_events: dict[str, int]
    """Warnings and errors in the daemon's log by event (alerts left out)."""

    @property
    def steps(self) -> int:
        return sum(p.steps for p in self.producers)

    @property
    def messages(self) -> int:
        return sum(p.messages for p in self.producers)


class _Probe:
    """CPU shares and the daemon's memory between two calls, from ``/proc``."""

    def __init__(self, svc: Services, fleet: Fleet) -> None:
        self.svc, self.fleet = svc, fleet
        self.last = self._read()
        self.first = self.last

    def _read(self) -> tuple[float, ...]:
        busy, iowait, total = machine_cpu()
        return (
            time.monotonic(),
            cpu_seconds(self.svc.daemon.pid),
            cpu_seconds(self.svc.nats.pid),
            self.fleet.cpu_seconds(),
            busy,
            iowait,
            total,
        )

    def sample(self, t0: float) -> Sample:
        now = self._read()
        dt = max(now[0] - self.last[0], 1e-9)
        series = scrape(self.svc.http_port)
        sample = Sample(
            t=time.time() - t0,
            lag=int(series.get(LAG_SERIES, 0)),
            committed=int(series[STEPS_SERIES]),
            daemon_cpu=(now[1] - self.last[1]) / dt,
            daemon_rss_mib=memory_mib(self.svc.daemon.pid, "VmRSS"),
            nats_cpu=(now[2] - self.last[2]) / dt,
            producers_cpu=max(0.0, now[3] - self.last[3]) / dt,
            machine_busy=(now[4] - self.last[4]) / max(now[6] - self.last[6], 1e-9),
            machine_iowait=(now[5] - self.last[5]) / max(now[6] - self.last[6], 1e-9),
            commits=int(series.get(COMMITS_SERIES, 0)),
        )
        # Producers that exited take their CPU time with them: keep the highest total seen.
        self.last = (*now[:3], max(now[3], self.last[3]), *now[4:])
        return sample


def run_fleet(spec: FleetSpec, sample_every: float = 2.0) -> FleetReport:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        svc = start_services(stack, tmp)
        base = int(scrape(svc.http_port)[STEPS_SERIES])
        watch = stack.enter_context(AlertWatch(svc.url))
        fleet = stack.enter_context(Fleet(spec, svc.url, tmp))
        fleet.start()
        cpu0 = {"daemon": cpu_seconds(svc.daemon.pid), "nats-server": cpu_seconds(svc.nats.pid)}
        probe = _Probe(svc, fleet)
        t0 = fleet.go()
        samples = []
        next_sample = t0 + sample_every
        while fleet.running():
            time.sleep(max(0.0, min(0.2, next_sample - time.time())))
            if time.time() >= next_sample:
                samples.append(probe.sample(t0))
                next_sample += sample_every
        producers_cpu = probe.last[3] - probe.first[3]  # up to the last sample while they ran
        reports = fleet.wait(60)
        total = sum(r.steps for r in reports)
        last_publish = max(r.t_last_publish for r in reports)
        while (committed := int(scrape(svc.http_port)[STEPS_SERIES])) < base + total:
            if time.time() >= next_sample:
                samples.append(probe.sample(t0))
                next_sample += sample_every
            if time.time() - last_publish > 1800:
                raise TimeoutError(f"the daemon committed {committed - base} of {total} steps 1800 s after the fleet")
            time.sleep(0.05)
        caught_up = time.time()
        cpu = {
            "producers": sum(r.cpu_s for r in reports) or producers_cpu,
            "daemon": cpu_seconds(svc.daemon.pid) - cpu0["daemon"],
            "nats-server": cpu_seconds(svc.nats.pid) - cpu0["nats-server"],
        }
        time.sleep(1.0)  # alerts go out right after their batch's commit
        alerts = watch.alerts()
        peak = shut_down(svc)
        rows = stored_rows(svc.db_path, f"{spec.prefix}-%")
        events = log_events(tmp / "daemon.log")
        events.pop("anomaly", None)
        return FleetReport(
            spec=spec,
            producers=reports,
            samples=samples,
            alerts=alerts,
            straggler=straggler_verdict(spec, reports, alerts),
            nan=nan_latencies(reports, alerts),
            caught_up_s=caught_up - last_publish,
            cpu=cpu,
            wall_s=caught_up - t0,
            peak_rss_mib=peak,
            rows=rows.rows,
            distinct=rows.distinct,
            log_events=dict(events),
        )


def _ms(values: np.ndarray, q: float) -> str:
    return f"{np.percentile(values, q) * 1000:,.0f}" if len(values) else "-"


def format_fleet(r: FleetReport) -> str:
    spec, s = r.spec, r.samples
    lags = np.array([x.lag for x in s]) if s else np.zeros(1)
    live = [x for x in s if x.t <= spec.seconds] or s
    cpu = np.array([x.daemon_cpu for x in live]) * 100 if live else np.zeros(1)
    rss = max([x.daemon_rss_mib for x in s] or [0.0])
    v = r.straggler
    if v is None:
        named = "no straggler"
    elif v.named_step is None:
        named = f"NOT NAMED by step {v.last_step}: slow from {v.first_slow_step}, deadline +{v.deadline_steps}"
    else:
        named = (
            f"+{v.late_steps} steps / {v.named_after_s:.0f} s (deadline {v.deadline_steps} steps) "
            f"{'PASS' if v.in_time else 'LATE'}"
        )
    ok = "OK" if r.rows == r.distinct == r.steps else "MISMATCH"
    head = ["ranks", "producers", "seconds", "messages/s", "steps/s", "lag p50 / max (msgs)", "daemon CPU mean / max"]
    head += ["daemon RSS max / peak MiB", "NaN log()->alert p50 / p99 ms (n)", "straggler named", "rows stored"]
    row = [
        f"{spec.ranks:,}",
        spec.producers,
        f"{spec.seconds:g}",
        f"{r.messages / spec.seconds:,.0f}",
        f"{r.steps / spec.seconds:,.0f}",
        f"{np.percentile(lags, 50):,.0f} / {lags.max():,.0f}",
        f"{cpu.mean():.0f}% / {cpu.max():.0f}%",
        f"{rss:.0f} / {r.peak_rss_mib:.0f}",
        f"{_ms(r.nan.log_to_alert_s, 50)} / {_ms(r.nan.log_to_alert_s, 99)} ({len(r.nan.log_to_alert_s)})",
        named,
        f"{r.rows:,}/{r.steps:,} {ok}",
    ]
    return table(head, [row])


def _catch_up(r: FleetReport) -> str:
    """The daemon's pace once the fleet stopped publishing: what it sustains at this message size."""
    after = [x for x in r.samples if x.t > r.spec.seconds + 2]
    if len(after) < 2:
        return "the daemon kept up: no backlog left when the fleet stopped"
    a, b = after[0], after[-1]
    steps = (b.committed - a.committed) / (b.t - a.t)
    per_message = r.steps / max(r.messages, 1)
    return (
        f"draining the backlog after the fleet stopped: {steps:,.0f} steps/s = {steps / per_message:,.0f} messages/s "
        f"at {np.mean([x.daemon_cpu for x in after]):.0%} of a core (the daemon's pace at this message size)"
    )


def format_fleet_notes(r: FleetReport) -> list[str]:
    spec, s = r.spec, r.samples
    total_cpu = sum(r.cpu.values()) or 1.0
    split = ", ".join(f"{k} {v:.1f} s ({v / total_cpu:.0%})" for k, v in r.cpu.items())
    by_detector: dict[str, int] = {}
    for _, a in r.alerts:
        if a.state == "open":
            by_detector[a.detector] = by_detector.get(a.detector, 0) + 1
    late = max(p.late_max_s for p in r.producers)
    failures: dict[str, int] = {}
    for p in r.producers:
        for k, n in p.failures.items():
            failures[k] = failures.get(k, 0) + n
    lines = [
        f"{spec.runs} runs x {spec.ranks_per_run} ranks over {spec.producers} producer processes; each rank one "
        f"message per {spec.interval:g} s with {spec.steps_per_message} steps (step_time {spec.step_time:g} s); "
        f"producers at most {late * 1000:.0f} ms behind schedule; resent {sum(p.resent for p in r.producers)} "
        f"({failures or 'no failures'})",
        f"the daemon committed the last step {r.caught_up_s:.1f} s after the last publish; CPU seconds from go to "
        f"then ({os.cpu_count()} CPUs x {r.wall_s:.0f} s): {split}",
        _catch_up(r),
        "over time: t s, lag (msgs), rows per daemon transaction since the last line, CPU (share of one core) of "
        "the daemon, nats-server and producers, machine busy / iowait (share of all CPUs), daemon RSS MiB:",
    ]
    step = max(1, round(5.0 / max(s[1].t - s[0].t, 1e-9))) if len(s) > 1 else 1
    shown = s[::step]
    for before, x in zip([None, *shown], shown, strict=False):
        rows = (x.committed - before.committed) / max(x.commits - before.commits, 1) if before else 0.0
        lines.append(
            f"  {x.t:5.0f} {x.lag:8,d} {rows:7,.0f} {x.daemon_cpu:6.0%} {x.nats_cpu:6.0%} {x.producers_cpu:6.0%}"
            f" {x.machine_busy:6.0%} / {x.machine_iowait:4.0%} {x.daemon_rss_mib:6.0f}"
        )
    if len(r.nan.log_to_alert_s):
        lines.append(
            f"NaN injections: {r.nan.injected}, alerted {len(r.nan.log_to_alert_s)}, missed {r.nan.missed}; "
            f"publish->alert p50 / p99 {_ms(r.nan.publish_to_alert_s, 50)} / {_ms(r.nan.publish_to_alert_s, 99)} ms "
            f"(the NaN is the last step of its message: log()->publish is the producer's lateness only)"
        )
    lines.append(f"alert episodes opened by detector: {by_detector or 'none'}")
    lines.append(f"daemon log, warnings and errors besides alerts: {r.log_events or 'none'}")
    if r.straggler is not None:
        lines.append(
            f"straggler {r.straggler.run_id} rank {r.straggler.rank} slow from step {r.straggler.first_slow_step}; "
            f"other ranks named as stragglers: {r.straggler.others_named}"
        )
    return lines
