"""Other threads' frames without CPython 3.11's deadlock in ``sys._current_frames``.

``sys._current_frames()`` holds the interpreter's thread-list lock while it creates frame
objects. Up to CPython 3.11 a frame object's allocation can start a garbage collection right
there, and a ``threading.local`` freed by that collection takes the same lock again: the
calling thread then waits on itself forever, holding the GIL, and the whole process stops
(CPython gh-106883; fixed in 3.12, the 3.11 fix was not merged). The GIL sampler asks for
frames up to 20 times a second for the life of a run, and the stuck probe whenever a loop
stops, so a training process running on 3.11 froze mid-step now and then.

:func:`current_frames` holds the collector off for the duration of the call.
"""

from __future__ import annotations

import gc
import operator
import sys
from types import FrameType
from typing import cast


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with no garbage collection able to start inside it.

    The collector is disabled, the frames read, and the collector enabled again by builtins
    called one after another from C (``map`` over the three), so no other thread runs Python
    in between and none sees or changes the collector's state meanwhile. When the collector is
    already disabled it is left alone.
    """
    if not gc.isenabled():
        return sys._current_frames()
    try:
        _, frames, _ = map(operator.call, (gc.disable, sys._current_frames, gc.enable))
    except BaseException:
        gc.enable()  # sys._current_frames raised (an audit hook, memory): the collector runs again
        raise
    return cast("dict[int, FrameType]", frames)  # map() loses the middle call's type
