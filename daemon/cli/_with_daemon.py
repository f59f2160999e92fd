"""Run a client's work against the daemon that answers at the configured broker, or one started here.

``vigil bench-optim`` needs a daemon (its runs must be judged and stored like any other): when
none answers SQL at the broker, one is started in this process on ``--data-dir`` (with the
bundled broker unless a broker answers), for as long as the work lasts, as ``vigil canary run``
does for canaries.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from trainvigil.daemon.cli.sqlclient import _Connection
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.subjects import Subjects

T = TypeVar("T")
Work = Callable[["_Connection", str], Awaitable[T]]
"""The work, given a connection to a broker a daemon answers on, and that broker's URL."""
Probe = Callable[["_Connection", str, "Subjects"], Awaitable[bool]]
"""Whether a daemon of the namespace answers on the connection (for what the work needs of it)."""


def _say(text: str) -> None:
    print(f"vigil: {text}", file=sys.stderr, flush=True)


async def answers_sql(conn: _Connection, url: str, subjects: Subjects) -> bool:
    """Whether a daemon of ``subjects``' namespace answers read-only queries on ``conn``."""
    from trainvigil.daemon.cli.sqlclient import _ask
    from trainvigil.schemas.query import QueryRequest

    return await _ask(conn, url, QueryRequest(sql="SELECT 1"), 10, subjects.query) is not None


async def with_daemon(
    config: DaemonConfig,
    role: str,
    work: Work[T],
    answers: Probe = answers_sql,
    *,
    interrupted: str = "interrupted before the work was done",
    before_start: Callable[[], None] = lambda: None,
) -> T:
    """``work`` against the daemon of ``config``'s namespace at its broker, or against one started here for its
    duration.

    Args:
        role: whose credentials connect (``access(config, role)``).
        answers: asks whether a daemon is there; it may raise to say these credentials may not ask.
        interrupted: the error when the daemon started here stops (a signal) before ``work`` ends.
        before_start: called when none answers, before one is started here: it raises to refuse what
            that daemon would refuse, while nothing has been created yet.

    Raises:
        DaemonUnavailableError: the daemon started here does not answer, or it stopped first.
    """
    import anyio
    import msgspec
    from anyio.abc import TaskStatus

    from trainvigil.daemon.app import serve
    from trainvigil.daemon.broker.bus import access
    from trainvigil.daemon.cli.sqlclient import _connect, data_dir_note
    from trainvigil.daemon.logs import configure
    from trainvigil.errors import DaemonUnavailableError
    from trainvigil.schemas.redact import redact_url

    url = config.nats_url or f"nats://127.0.0.1:{config.embedded_port}"
    conn = await _connect(url, access(config, role))
    if conn is not None and conn.nc is not None:
        try:
            if await answers(conn, url, config.subjects):
                if note := await data_dir_note(conn, url, config.data_dir, config.subjects):
                    _say(note)
                return await work(conn, url)
        finally:
            await conn.nc.close()
    before_start()
    _say(f"no daemon answered at {redact_url(url)}")
    local = msgspec.structs.replace(config, http_port=0, nats_url=url if conn is not None else config.nats_url)
    configure(local.log_format, "error")  # what matters is reported here; its log would say it twice
    result: list[T] = []
    async with anyio.create_task_group() as tg:

        async def daemon(*, task_status: TaskStatus[str]) -> None:
            await serve(local, task_status=task_status)
            tg.cancel_scope.cancel()  # stopped by a signal: stop the work too

        started: str = await tg.start(daemon)
        _say(f"started a daemon here on {started} (data in {local.data_dir}) for this command")
        mine = await _connect(started, access(local, role))
        if mine is None or mine.nc is None:
            raise DaemonUnavailableError(f"the daemon started here does not answer at {started}")
        try:
            result.append(await work(mine, started))
        finally:
            await mine.nc.close()
            tg.cancel_scope.cancel()
    if not result:
        raise DaemonUnavailableError(interrupted)
    return result[0]
