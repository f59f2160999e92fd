"""What a sealed spill file may publish: its own run's data subjects (``vigil.v1.<run>.<kind>``), nothing else.

An agent writes one run's messages to a file, each on :func:`~trainvigil.schemas.subjects.data_subject` of
that run. A file whose frames name any other subject was not written by an agent: published as it is, a
``$JS.API.STREAM.DELETE.VIGIL`` frame deletes the stream on an open bus, and a ``vigil.v1.ctl.*`` or
``vigil.v1.alerts.*`` one forges requests or alerts. Such a file is refused whole before anything of it is
sent (:func:`foreign_frame`): its other frames are no more trustworthy, and left as it is, it loses nothing.

The file's run is the run token of its first frame still to send (the header names only the broker, and a
file's name can be changed); every later frame must be on that run's data subjects too.
"""

from __future__ import annotations

import re
from typing import BinaryIO

from trainvigil.schemas.subjects import KINDS, PREFIX, run_token
from trainvigil.schemas.terminal import terminal_safe

from .outbox import read_frame

_DATA = re.compile(rf"{re.escape(PREFIX)}\.([^.]+)\.({'|'.join(map(re.escape, KINDS))})")
_SHAPE = f"{PREFIX}.<run>.<{'|'.join(KINDS)}>"


def data_run(subject: str) -> str | None:
    """The run token of an agent's data subject; ``None`` for any other subject (a token ``run_token`` never
    makes, such as ``alerts`` or ``ctl``, included)."""
    found = _DATA.fullmatch(subject)
    if found is None or run_token(found.group(1)) != found.group(1):
        return None
    return found.group(1)


def foreign_frame(f: BinaryIO) -> str:
    """Why the frames of ``f`` from its position on may not be published (a frame off the data subjects of the
    first one's run), or ``""`` when they all may; ``f`` is left where it was.

    A frame cut short ends the check: the frames before it are what an upload sends, and it says so itself.
    """
    at = f.tell()
    run = None
    n = 0
    try:
        while True:
            try:
                item = read_frame(f)
            except OSError:
                return ""
            except UnicodeDecodeError:
                return f"frame {n + 1}'s subject or message id is not UTF-8 text"
            if item is None:
                return ""
            n += 1
            subject = item[0].subject
            token = data_run(subject)
            if token is None:
                return f"frame {n} is published on '{terminal_safe(subject)}', not on an agent's data subject {_SHAPE}"
            if run is None:
                run = token
            elif token != run:
                return f"frame {n} is published on '{terminal_safe(subject)}', a run other than its own ({run})"
    finally:
        f.seek(at)
