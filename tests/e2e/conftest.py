"""The e2e tier's ``daemon`` is ``vigil up`` as a process: these tests kill and signal it, time what runs beside it,
and run it as users run it; the in-process daemon of the integration tier shares the test's process for that
(``tests/_support/inprocess.py`` says what it shares)."""

from __future__ import annotations

import pytest
from support import Daemon


@pytest.fixture
def daemon(process_daemon: Daemon) -> Daemon:
    return process_daemon
