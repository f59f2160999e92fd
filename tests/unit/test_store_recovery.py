"""The writer's one state (``daemon/store/_recovery.py``): what a failed write or an invalidated database
leaves to settle, and the only moves between states."""

from __future__ import annotations

import itertools

import pytest

from trainvigil.daemon.store._recovery import Happened, Recovery, WriterState, advance

READY, UNSURE, INVALIDATED = WriterState.READY, WriterState.UNSURE, WriterState.INVALIDATED

ALLOWED = {
    (READY, Happened.WRITE_FAILED): UNSURE,
    (UNSURE, Happened.WRITE_FAILED): UNSURE,
    (INVALIDATED, Happened.WRITE_FAILED): INVALIDATED,
    (READY, Happened.INVALIDATED): INVALIDATED,
    (UNSURE, Happened.INVALIDATED): INVALIDATED,
    (INVALIDATED, Happened.INVALIDATED): INVALIDATED,
    (UNSURE, Happened.RESUMED): READY,
    (INVALIDATED, Happened.RESUMED): INVALIDATED,
    (INVALIDATED, Happened.REOPENED): READY,
}


@pytest.mark.parametrize(("state", "happened"), list(itertools.product(WriterState, Happened)))
def test_each_move_is_allowed_or_refused_as_a_bug(state: WriterState, happened: Happened) -> None:
    if (state, happened) in ALLOWED:
        assert advance(state, happened) is ALLOWED[state, happened]
    else:
        with pytest.raises(ValueError, match=f"cannot be {happened.value} while {state.value}"):
            advance(state, happened)


def test_an_invalidated_database_outranks_a_failed_write_until_it_is_opened_again() -> None:
    """Opening the database again reads the offset back: it settles the failed write too."""
    recovery = Recovery()
    assert recovery(Happened.WRITE_FAILED) is UNSURE
    assert recovery(Happened.INVALIDATED) is INVALIDATED
    assert recovery(Happened.WRITE_FAILED) is INVALIDATED
    assert recovery(Happened.RESUMED) is INVALIDATED, "a reader's invalidation is not lost to a resume"
    assert recovery(Happened.REOPENED) is READY
    assert recovery.state is READY
