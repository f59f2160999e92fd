"""``gil_contention``: the GIL is held most of the time and threads queue for it → page.

One ``GilSample`` is one sampling period of one (run, rank). A period is *contended* when
``held > held_threshold`` and the median wait is above the switch interval (a waiting thread
routinely needs a forced switch to get the GIL). ``consecutive`` contended periods in a
row page; the episode clears after ``cooldown`` uncontended periods. Positions are the
stream's period count (GIL samples carry no step). Free-threaded builds (``gil_enabled``
false) are never judged.
"""

from __future__ import annotations

from typing import ClassVar

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._settings import GilContentionSettings
from trainvigil.schemas import Anomaly, GilSample


def _top(sample: GilSample) -> str:
    threads = sorted(sample.threads, key=lambda t: -t.share)[:3]
    named = []
    for t in threads:
        if t.share <= 0:
            continue
        where = f" in {', '.join(t.top_functions[:2])}" if t.top_functions else ""
        named.append(f"{t.name} {t.share:.0%}{where}")
    return "; ".join(named) if named else "no thread attributed (attribution needs Linux)"


def _message(sample: GilSample, periods: int) -> str:
    return (
        f"GIL held {sample.held:.0%} of the time with p50 wait {sample.wait_p50 * 1e3:.1f} ms "
        f"(switch interval {sample.switch_interval * 1e3:.1f} ms) for {periods} periods; top threads: "
        f"{_top(sample)}. Move that pure-Python work out of the training process (DataLoader "
        "num_workers > 0, multiprocessing), vectorise it with numpy/torch, or release the GIL in "
        "the C extension; profile locally with trainvigil.gil.detect_gil_contention()"
    )


class _Stream:
    __slots__ = ("contended", "latest", "period")

    def __init__(self) -> None:
        self.period = -1
        """Position of the latest sample judged (the stream's period count)."""
        self.contended = 0
        """Contended periods in a row."""
        self.latest = float("-inf")
        """Time of the latest sample judged: one seen again (redelivered, or a batch judged again) is skipped."""


class GilContention(StreamDetector[_Stream]):
    name: ClassVar[str] = "gil_contention"
    Settings: ClassVar[type[DetectorSettings]] = GilContentionSettings

    def new_state(self) -> _Stream:
        return _Stream()

    def contended(self, sample: GilSample) -> bool:
        return (
            sample.gil_enabled
            and sample.held > self.settings.held_threshold
            and sample.wait_p50 > sample.switch_interval
        )

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        out: list[Anomaly] = []
        for source, sample in sorted(batch.gil_samples, key=lambda sg: sg[1].time):
            if not sample.gil_enabled:
                continue
            key = (source.run_id, source.rank)
            state = self.state(key)
            if sample.time <= state.latest:
                continue
            state.latest = sample.time
            state.period += 1
            state.contended = state.contended + 1 if self.contended(sample) else 0
            if state.contended >= self.settings.consecutive:
                finding = Finding(sample.held, None, self.settings.held_threshold, _message(sample, state.contended))
                out.extend(self.episodes.flag(key, state.period, PAGE, sample.time, finding))
            else:
                out.extend(self.episodes.quiet(key, state.period, sample.time))
        return out
