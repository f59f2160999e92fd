"""What a sealed spill file may publish: its own run's data subjects (``vigil.v1.<run>.<kind>``), nothing else.

An agent writes one run's messages to a file, each on :meth:`~trainvigil.schemas.subjects.Subjects.data` of
that run in its namespace. A file whose frames name any other subject was not written by an agent: published
as it is, a ``$JS.API.STREAM.DELETE.VIGIL`` frame deletes the stream on an open bus, and a ``vigil.v1.ctl.*``
or ``vigil.v1.alerts.*`` one forges requests or alerts. Such a file is refused whole before anything of it is
sent (:func:`foreign_frame`): its other frames are no more trustworthy, and left as it is, it loses nothing.
A file of another namespace's agent is refused too (its data belongs to another daemon), naming both
namespaces, so it can be pushed to its own.

The file's run is the run token of its first frame still to send (the header names only the broker, and a
file's name can be changed); every later frame must be on that run's data subjects too.
"""

from __future__ import annotations

from typing import BinaryIO

from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, KINDS, Subjects, data_namespace, describe_namespace
from trainvigil.schemas.terminal import terminal_safe

from .outbox import read_frame


def _off_subject(n: int, subject: str, subjects: Subjects) -> str:
    """Why frame ``n`` on ``subject`` (no data subject of ``subjects``' namespace) may not be published."""
    shown = terminal_safe(subject)
    other = data_namespace(subject)
    if other is not None:
        return (
            f"frame {n} is published on '{shown}', a data subject of {describe_namespace(other)}, not of this "
            f"one's, {describe_namespace(subjects.namespace)}; push it with that namespace (--namespace, "
            "VIGIL_NAMESPACE)"
        )
    shape = f"{subjects.prefix}.<run>.<{'|'.join(KINDS)}>"
    return f"frame {n} is published on '{shown}', not on an agent's data subject {shape}"


def foreign_frame(f: BinaryIO, subjects: Subjects = DEFAULT_SUBJECTS) -> str:
    """Why the frames of ``f`` from its position on may not be published (a frame off the data subjects of the
    first one's run in ``subjects``' namespace), or ``""`` when they all may; ``f`` is left where it was.

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
            token = subjects.data_run(subject)
            if token is None:
                return _off_subject(n, subject, subjects)
            if run is None:
                run = token
            elif token != run:
                return f"frame {n} is published on '{terminal_safe(subject)}', a run other than its own ({run})"
    finally:
        f.seek(at)
