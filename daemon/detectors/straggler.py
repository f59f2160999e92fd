"""``straggler``: one rank is slower than the fastest rank of its run over the same steps.

A window spans at least ``min_steps`` steps and ``min_seconds`` seconds (20 and 10 s by default,
as ``slowdown``'s; sized once per run from its typical step time, so a rank 1.55x slower walks a
window in 15.5 s: on the real-run corpus it is paged 18 s after it slowed). The typical step time is
the median of the first ``min_steps`` values of the first rank to log that many, whatever messages
they came in: sized from the first message alone, a run whose agent sent its first step or two by
themselves (the slow first steps of a warm-up) got windows of half the length, and warm-up noise
between ranks then filled two of them. Steps are cut into
aligned half-window buckets, and each
rank's window is its last two buckets, judged as each bucket completes (windows slide by
half a window, as in ``slowdown``). Each rank's median ``step_time`` over its window
(checkpoint/eval steps left out) is compared with the fastest rank's over the same steps:
score = fastest / this rank's median. Below ``warn``/``page`` in two consecutive windows
raises an alert naming the slow rank. A rank's first bucket is its warm-up and is in no window: a
clean two-rank canary had one rank 15 % slower than the other over its first dozen steps alone, two
windows holding them, and was warned a straggler (CI, 1 run in 2 to 4). A slowdown of every rank is
``slowdown``'s business.
State is per run: it goes once every rank of its ``world_size`` has ended or the run went idle.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import DetectorSettings, Episodes, Finding
from trainvigil.daemon.detectors._robust import fast_median
from trainvigil.daemon.detectors._series import StreamKey, Values, streams
from trainvigil.daemon.detectors._settings import StragglerSettings
from trainvigil.daemon.detectors._windows import severity_of
from trainvigil.schemas import Anomaly


class _Run:
    __slots__ = ("bucket", "early", "last_full", "medians", "partial", "previous", "watermark", "world")

    def __init__(self) -> None:
        self.bucket = 0
        """Steps per half window; 0 until sized."""
        self.early: dict[int, list[Values]] = {}
        """rank → its values while the run is not sized yet, in order."""
        self.world = 1
        self.watermark: dict[int, int] = {}
        self.partial: dict[int, tuple[int, np.ndarray]] = {}
        """rank → (bucket, values so far) of the bucket the rank is in."""
        self.last_full: dict[int, tuple[int, np.ndarray]] = {}
        """rank → (bucket, values) of its latest complete bucket: the first half of its next window. A rank's
        first bucket is its warm-up: kept with no values, so it is in no window."""
        self.medians: dict[int, dict[int, float]] = {}
        """bucket → rank → median, for buckets not judged yet."""
        self.previous: dict[int, int] = {}


class Straggler:
    name: ClassVar[str] = "straggler"
    Settings: ClassVar[type[DetectorSettings]] = StragglerSettings
    coalesce: ClassVar[bool] = True

    def __init__(self, settings: StragglerSettings) -> None:
        self.settings = settings
        self.episodes = Episodes(self.name, settings.cooldown_buckets)
        self._runs: dict[str, _Run] = {}

    def forget(self, key: StreamKey) -> None:
        """A rank ended or went idle: its episode goes; its buckets stay until the whole run is forgotten."""
        self.episodes.forget(key)

    def forget_run(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def tracked(self) -> int:
        return len(self._runs) + len(self.episodes)

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        cfg = self.settings
        touched: set[str] = set()
        for (run_id, rank), steps in streams(batch).items():
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = _Run()
            run.world = max(run.world, steps.world_size, rank + 1)
            v = steps.working(cfg.metric, run.watermark.get(rank, -(2**63)))
            if not len(v):
                continue
            run.watermark[rank] = int(v.step[-1])
            if run.bucket:
                self._collect(run, rank, v)
            elif not self._sized(run, rank, v):
                continue
            touched.add(run_id)
        out: list[Anomaly] = []
        for run_id in touched:
            out.extend(self._judge(run_id, self._runs[run_id], batch))
        return out

    def _sized(self, run: _Run, rank: int, v: Values) -> bool:
        """Hold ``v`` back until ``rank`` has ``min_steps`` usable values; then size the run's buckets from their
        median and collect what every rank held back. Whether the run is sized now."""
        ok = np.isfinite(v.value) & (v.value > 0)
        parts = run.early.setdefault(rank, [])
        if ok.any():
            parts.append(Values(v.step[ok], v.value[ok], v.time[ok]))
        need = max(1, self.settings.min_steps)
        if sum(map(len, parts)) < need:
            return False  # at most min_steps - 1 values held per rank
        typical = float(np.median(np.concatenate([part.value for part in parts])[:need]))
        run.bucket = max(1, max(self.settings.min_steps, math.ceil(self.settings.min_seconds / typical)) // 2)
        early, run.early = run.early, {}
        for held_rank, held_back in early.items():
            for part in held_back:
                self._collect(run, held_rank, part)
        return True

    def _collect(self, run: _Run, rank: int, v: Values) -> None:
        """Add a rank's values; every bucket the rank has moved past gets its median."""
        ok = np.isfinite(v.value) & (v.value > 0)
        buckets, values = v.step[ok] // run.bucket, v.value[ok]
        pending = run.partial.get(rank)
        if pending is not None:
            buckets = np.concatenate([np.full(len(pending[1]), pending[0]), buckets])
            values = np.concatenate([pending[1], values])
        if not len(values):
            return
        last = int(buckets[-1])
        complete = buckets < last
        if complete.any():
            done = buckets[complete]
            edges = np.flatnonzero(np.diff(done)) + 1
            for start, stop in zip(np.r_[0, edges], np.r_[edges, len(done)], strict=True):
                bucket, part = int(done[start]), values[start:stop]
                before = run.last_full.get(rank)
                if before is None:  # its warm-up (first allreduce, caches, compiles): judged in no window
                    run.last_full[rank] = (bucket, part[:0])
                    continue
                window = np.concatenate([before[1], part]) if before[0] == bucket - 1 else part
                run.medians.setdefault(bucket, {})[rank] = fast_median(window)
                run.last_full[rank] = (bucket, part)
        run.partial[rank] = (last, values[~complete])

    def _judge(self, run_id: str, run: _Run, batch: IngestBatch) -> list[Anomaly]:
        cfg = self.settings
        out: list[Anomaly] = []
        for bucket in sorted(run.medians):
            medians = run.medians[bucket]
            if len(medians) < run.world and len(run.medians) <= cfg.max_pending:
                break
            del run.medians[bucket]
            if len(medians) < 2:
                continue
            fastest = min(medians.values())
            last_step = (bucket + 1) * run.bucket - 1
            when = batch.now if batch.now is not None else float("nan")
            for rank, median in medians.items():
                score = fastest / median
                now = severity_of(score, cfg.warn, cfg.page)
                severity = (
                    now if run.previous.get(rank, 0) else 0
                )  # as slowdown: two slow windows, the latest's severity
                run.previous[rank] = now
                key = (run_id, rank)
                if severity:
                    finding = Finding(
                        score,
                        fastest,
                        cfg.page if severity == 2 else cfg.warn,
                        f"rank {rank} is a straggler: median {cfg.metric} {median:.4g}s against {fastest:.4g}s on "
                        f"the fastest rank (speed {score:.2f}) over two windows up to step {last_step}; check that "
                        "rank's host (GPU clocks, thermal throttling, NIC, other jobs) or its data shard",
                    )
                    out.extend(self.episodes.flag(key, bucket, severity, when, finding, step=last_step))
                else:
                    out.extend(self.episodes.quiet(key, bucket, when))
        return out
