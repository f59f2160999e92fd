"""``slowdown``: a rank's step time has grown against its own best.

Score = the rank's reference speed (the ``reference_quantile`` of its recent healthy window
medians of ``step_time``) / the current window median (1 = as fast as usual). A window is the
last ``min_steps`` steps and ``min_seconds`` seconds, whichever is longer (20 and 10 s by
default, so a 1.4x slowdown 11 s into a 27 s run is paged 12 s after it: 30 s windows missed it,
and on the real-run corpus recorded on an idle machine 10 s windows raise nothing on 61 400
healthy steps; on a machine shared with other jobs they page the real 1.3-2.7x slowdowns the
neighbours cause, which 30 s windows mostly average away),
judged every half window; checkpoint/eval steps are left out. A score below ``warn`` in two
consecutive windows raises the alert, so one noisy window never does; its severity is the
latest window's (below ``page``: page), because the window before may straddle the change.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._series import streams
from trainvigil.daemon.detectors._settings import SlowdownSettings
from trainvigil.daemon.detectors._windows import Windows, severity_of
from trainvigil.schemas import Anomaly


class _Stream:
    __slots__ = ("best", "healthy", "index", "previous", "watermark", "windows")

    def __init__(self, cfg: SlowdownSettings) -> None:
        self.windows = Windows(cfg.min_steps, cfg.min_seconds)
        self.watermark = -(2**63)
        self.best = float("inf")
        self.healthy: deque[float] = deque(maxlen=cfg.reference_windows)
        """Medians of the latest unflagged windows: the reference is their ``reference_quantile``."""
        self.previous = 0
        self.index = 0


class Slowdown(StreamDetector[_Stream]):
    name: ClassVar[str] = "slowdown"
    Settings: ClassVar[type[DetectorSettings]] = SlowdownSettings
    coalesce: ClassVar[bool] = True

    def __init__(self, settings: SlowdownSettings) -> None:
        super().__init__(settings, settings.cooldown_windows)

    def new_state(self) -> _Stream:
        return _Stream(self.settings)

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        cfg = self.settings
        out: list[Anomaly] = []
        for key, steps in streams(batch).items():
            state = self.state(key)
            v = steps.working(cfg.metric, state.watermark)
            if not len(v):
                continue
            state.watermark = int(v.step[-1])
            for last_step, last_time, median in state.windows.feed(v):
                state.index += 1
                score = state.best / median if state.best < float("inf") else 1.0
                now = severity_of(score, cfg.warn, cfg.page)
                # Two slow windows in a row raise it; the latest says how slow (the one before may
                # straddle the change and read milder).
                severity = now if state.previous else 0
                state.previous = now
                if not now:
                    state.healthy.append(median)
                    state.best = float(np.quantile(state.healthy, cfg.reference_quantile))
                if severity:
                    finding = Finding(
                        score,
                        state.best,
                        cfg.page if severity == 2 else cfg.warn,
                        f"rank {key[1]} is slower: median {cfg.metric} {median:.4g}s against its best "
                        f"{state.best:.4g}s (speed {score:.2f}) for two windows up to step {last_step}; "
                        "look for thermal throttling, a noisy neighbour, data-loader starvation or memory pressure",
                    )
                    out.extend(self.episodes.flag(key, state.index, severity, last_time, finding, step=last_step))
                else:
                    out.extend(self.episodes.quiet(key, state.index, last_time))
        return out
