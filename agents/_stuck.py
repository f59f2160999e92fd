"""Where a stuck training loop is: a short stack sample of the training thread for heartbeats.

Only when no step has completed for ``after_s`` does the worker look (``current_frames``,
a few microseconds, on the agent's thread): a healthy loop never pays for it. The daemon's
``hang`` detector puts the frames in its page ("stuck in all_reduce").
"""

from __future__ import annotations

import os
import threading
import time
import traceback

from trainvigil.schemas.limits import MAX_FRAMES, MAX_NAME

from ._frames import current_frames

FRAMES = 8
"""Innermost frames kept: enough to see the library call and the user's line that made it."""


class StuckProbe:
    """Watches the step counter the heartbeats report; samples the training thread once it stops."""

    def __init__(self, thread_id: int | None, after_s: float) -> None:
        self.thread_id = thread_id
        """The training thread (the one that called ``init()``)."""
        self.after_s = after_s
        self._step: object = None
        self._since = time.monotonic()

    def sample(self, last_step: object) -> list[str]:
        """The training thread's innermost frames if ``last_step`` has not moved for ``after_s``, else []."""
        now = time.monotonic()
        if last_step != self._step:
            self._step, self._since = last_step, now
            return []
        if last_step is None or now - self._since < self.after_s or self.thread_id is None:
            return []
        frame = current_frames().get(self.thread_id)
        if frame is None or self.thread_id == threading.get_ident():
            return []
        frames = traceback.extract_stack(frame)[-min(FRAMES, MAX_FRAMES) :]
        return [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"[:MAX_NAME] for f in frames]
