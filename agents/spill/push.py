"""Delivering sealed spill files: what runs that ended without a broker left in their spill directory.

Two callers share this: the next agent on the machine (on its worker thread, through its own
connection, see :class:`~trainvigil.agents.transport.worker.Worker`) and ``vigil push`` (:func:`push`).
A file is claimed with an exclusive ``flock`` first, so two uploaders never send the same file
at once; it is removed only once JetStream acknowledged every message in it. After each round,
the file's delivered mark (:func:`~.outbox.mark_delivered`) moves past what was acknowledged, so an
attempt cut short, even by a kill, leaves the next one only the rest to send (a file of the first
format, without a mark, gets the rest written back in its place). Every message keeps the
``Nats-Msg-Id`` it was first published with, so JetStream drops what it already stored within its
duplicate window.

A file names the broker its run was configured with. An agent delivers only files meant for
its own broker (a throwaway test broker never swallows a real run's data); ``vigil push``
delivers wherever it is told.

Whoever can write to the spill directory can leave a file there. One that is not a regular file (a
FIFO, a device, a link) is refused unopened; one with a frame on anything but its run's data subjects
is refused before anything of it is sent (:mod:`._spill_check`). Both stay as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from trainvigil.errors import EXIT_QUERY, EXIT_UNAVAILABLE, VigilError
from trainvigil.schemas.credentials import ANONYMOUS, BusAccess
from trainvigil.schemas.inputs import InputRefusedError, open_input
from trainvigil.schemas.natsconnect import BusConnectError, ConnectPolicy, connect
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects

from ..transport.acks import AckInbox, JetStream, publish_round
from ._spill_check import foreign_frame
from .outbox import OutMsg, copy_range, mark_delivered, read_frame, read_sealed_header, write_sealed

SUFFIX = ".spill"
"""Sealed files end with this; a live spill file (``.live``) or a half-written one (``.tmp``) never does."""


class NoBrokerError(VigilError, ConnectionError):
    """No NATS broker answered at ``url``."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class PushIncompleteError(VigilError):
    """Some spill files were not delivered in full; they stay where they are for the next attempt."""

    exit_code = EXIT_QUERY
    cli_prefix = "push incomplete: "

    def __init__(self, message: str, *, failed: list[FileResult]) -> None:
        super().__init__(message)
        self.failed = failed


@dataclass
class FileResult:
    """What one upload of one file did: ``messages``, ``events`` and ``bytes`` acknowledged."""

    path: Path
    broker: str = ""
    """The broker the file was meant for."""
    messages: int = 0
    events: int = 0
    bytes: int = 0
    error: str = ""
    """Why not everything was delivered ("" when it was, or when the file was skipped)."""
    skipped: bool = False
    """Another process holds the file, or it is gone, or it is meant for another broker."""
    empty: bool = False
    """The file held nothing to send (a header only, or everything marked delivered); it was removed."""

    @property
    def done(self) -> bool:
        return not self.error and not self.skipped


def broker_key(url: str) -> str:
    """``url`` as sealed files record it, so that two spellings of one list compare equal; without its passwords
    (:func:`~trainvigil.schemas.redact.redact_url`): a file names its broker, never the secret."""
    return str(parse_nats_url(url))


def sealed_name(run_token: str, rank: int, pid: int, nonce: str) -> str:
    """A sealed file's name: unique per agent (the nonce), readable for people."""
    return f"{run_token}-r{rank}-p{pid}-{nonce}{SUFFIX}"


def leftovers(where: Path) -> list[Path]:
    """The sealed files in directory ``where`` (or ``where`` itself, when it is anything but a directory), oldest
    first. A ``*.spill`` entry that is not a regular file (a FIFO, a link) is listed too: :func:`upload` refuses
    it by kind, unopened, and says so, where skipping it would hide it."""
    try:
        if not stat.S_ISDIR(os.stat(where).st_mode):
            return [where]
    except FileNotFoundError:
        return []
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(where):
            if entry.name.endswith(SUFFIX) and not entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):  # delivered by someone else meanwhile
                    found.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path)))
    return [path for _, path in sorted(found)]


@contextlib.contextmanager
def _claim(path: Path) -> Iterator[BinaryIO | InputRefusedError | None]:
    """``path`` open and exclusively locked, or ``None`` when another process holds it or it is gone, or why it
    is refused unopened: not a regular file (opening a FIFO blocks; through a link, the delivered mark and the
    removal would hit another file)."""
    try:
        f = open_input(path, max_bytes=None)  # a stream: read a frame at a time, whatever its size
    except FileNotFoundError:
        yield None
        return
    except InputRefusedError as exc:
        yield exc
        return
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        # Whoever held the lock before may have removed or replaced the file meanwhile.
        try:
            same = os.lstat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        yield f if same else None


async def upload(
    js: JetStream,
    path: Path,
    *,
    max_inflight: int,
    ack_timeout: float,
    only_for: str | None = None,
    on_round: Callable[[FileResult], None] = lambda result: None,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> FileResult:
    """Publish the sealed file at ``path`` through ``js``, oldest message first, calling ``on_round``
    with what was acknowledged so far after each round that delivered something.

    The file is removed once every message was acknowledged; after a partial delivery (an
    error, or cancellation) only the unacknowledged rest is kept. With ``only_for`` (a
    :func:`broker_key`), a file meant for another broker is skipped. A file that is not a regular
    file, or has a frame off its run's data subjects in ``subjects``' namespace (:mod:`._spill_check`), is
    refused whole and left as it is. Never raises but for cancellation: failures are in the result.
    """
    result = FileResult(path)
    with _claim(path) as f:
        if isinstance(f, InputRefusedError):
            result.error = f"{f} (left untouched)"
            return result
        if f is None:
            result.skipped = True
            return result
        try:
            header = read_sealed_header(f)
        except (OSError, ValueError) as exc:
            result.error = f"{exc} (left untouched)"
            return result
        result.broker = redact_url(header.broker)  # a file of an older version may name the password
        if only_for is not None and result.broker != only_for:
            result.skipped = True
            return result
        offset = start = f.tell()
        if why := foreign_frame(f, subjects):
            result.error = (
                f"refused: {why}; nothing of it was sent and it is left as it is (no agent writes such a file: "
                "remove it if you did not make it)"
            )
            return result
        complete = False
        try:
            while True:
                batch: list[tuple[OutMsg, int]] = []
                while len(batch) < max_inflight and (item := read_frame(f)) is not None:
                    batch.append(item)
                if not batch:
                    complete = True
                    result.empty = offset == start
                    break
                acked, error = await publish_round(js, [m for m, _ in batch], ack_timeout)
                for msg, size in batch[:acked]:
                    result.messages += 1
                    result.events += msg.events
                    result.bytes += size
                    offset += size
                if acked:
                    if header.markable:
                        with contextlib.suppress(OSError):  # the old mark stays: those are sent again next time
                            mark_delivered(path, offset)
                    on_round(result)
                if acked < len(batch):
                    result.error = f"not acknowledged: {error!r}"
                    break
        except (OSError, UnicodeDecodeError) as exc:
            result.error = f"unreadable after byte {offset}: {exc}"
        finally:
            if complete:
                try:
                    os.unlink(path)  # under the lock: no one else can have started on it
                except OSError as exc:
                    result.error = f"delivered, but cannot be removed ({exc.strerror}); remove it by hand"
            elif offset > start and not header.markable:
                with contextlib.suppress(OSError):  # kept whole instead: the sent part is sent again later
                    write_sealed(path, result.broker, copy_range(f, offset))
    return result


async def push(
    url: str,
    paths: list[Path],
    *,
    on_file: Callable[[FileResult], None] = lambda result: None,
    on_round: Callable[[FileResult], None] = lambda result: None,
    max_inflight: int = 128,
    ack_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    access: BusAccess = ANONYMOUS,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> list[FileResult]:
    """Upload ``paths`` (sealed files) to the broker at ``url``, calling ``on_file`` after each and
    ``on_round`` during each (see :func:`upload`).

    Args:
        access: an agent's credentials and the CA to trust (``VIGIL_NATS_CREDS``, ``VIGIL_NATS_TLS_CA``).
        subjects: the namespace the files' agents published in (``VIGIL_NAMESPACE``); another's files are refused.

    Raises:
        ConfigError: ``url`` is not a NATS URL, or a file of ``access`` cannot be read.
        NoBrokerError: no broker answered at ``url``.
    """
    parsed = parse_nats_url(url, key="--nats / VIGIL_NATS_URL")
    policy = ConnectPolicy(name="vigil push", connect_timeout=2, deadline=connect_timeout, tries_per_node=2)
    try:
        nc = await connect(parsed, access, policy)
    except BusConnectError as exc:
        if exc.refused:
            raise NoBrokerError(f"the broker at {parsed} turned vigil push away: {exc.refused}", url=url) from None
        raise NoBrokerError(f"{exc}; start one (vigil up) or pass --nats URL", url=url) from None
    try:
        js = await AckInbox(nc).open()
        results = []
        for path in paths:
            result = await upload(
                js, path, max_inflight=max_inflight, ack_timeout=ack_timeout, on_round=on_round, subjects=subjects
            )
            on_file(result)
            results.append(result)
        return results
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2.0)
