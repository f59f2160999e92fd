"""Pages about forged records: once per run, within an hourly budget (pure: forgeries in, alerts out).

Decoding refuses a stream message that carries records only the daemon writes (alert updates,
canary verdicts) and notes it as a :class:`~trainvigil.daemon.batch.decode.Forgery`. Someone holding
an agent's credentials is writing what only the daemon may: worth a page, but one page per run, not one
per attempt, or the forger pages the on-call as often as it likes. Every attempt is still a dead
letter (reason ``forged``) and counted (``vigil_forged_records_total{kind=...}``).

A forger can also make up run ids, so the pages themselves have a budget: at most
:data:`PAGES_PER_HOUR` runs are paged an hour; past it one page says so, and the runs past the budget
are only counted that hour (a later attempt of theirs, in a later hour, pages then).
"""

from __future__ import annotations

from collections import Counter

from trainvigil.daemon.batch.decode import Forgery
from trainvigil.daemon.detectors._base import episode_id
from trainvigil.schemas import Anomaly

DETECTOR = "forged_record"
"""The alerts' detector name (one ``vigil_anomalies_total`` series, whatever the forger sends)."""
PAGES_PER_HOUR = 10
REMEMBERED_RUNS = 10_000
"""Runs already paged are remembered up to this many (the oldest forgotten first: paged again if it comes back)."""
_HOUR = 3600.0


class ForgeryPages:
    """Which forgeries page: the first of each run, :data:`PAGES_PER_HOUR` runs an hour at most."""

    def __init__(self, per_hour: int = PAGES_PER_HOUR) -> None:
        self.per_hour = per_hour
        self._paged: dict[str, None] = {}
        self._hour_began = float("-inf")
        self._paged_this_hour = 0
        self._over_budget = 0
        """Runs this hour not paged for the budget (0: the budget's page has not gone out yet)."""

    def pages(self, forged: list[Forgery], now: float) -> list[Anomaly]:
        """The pages for one batch's ``forged`` messages (``now``: Unix seconds)."""
        if now - self._hour_began >= _HOUR:
            self._hour_began, self._paged_this_hour, self._over_budget = now, 0, 0
        by_run: dict[str, list[Forgery]] = {}
        for forgery in forged:
            if forgery.run_id not in self._paged:
                by_run.setdefault(forgery.run_id, []).append(forgery)
        out: list[Anomaly] = []
        for run_id, attempts in by_run.items():
            if self._paged_this_hour < self.per_hour:
                self._paged_this_hour += 1
                self._remember(run_id)
                out.append(_page(run_id, attempts, now))
                continue
            self._over_budget += 1  # not remembered: its page may come in a later hour
            if self._over_budget == 1:
                out.append(_budget_page(self.per_hour, now))
        return out

    def _remember(self, run_id: str) -> None:
        self._paged[run_id] = None
        while len(self._paged) > REMEMBERED_RUNS:
            del self._paged[next(iter(self._paged))]


def _page(run_id: str, attempts: list[Forgery], now: float) -> Anomaly:
    kinds: Counter[str] = Counter()
    for attempt in attempts:
        kinds.update(attempt.kinds)
    subjects = ", ".join(sorted({a.subject for a in attempts}))
    said = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return Anomaly(
        time=now,
        run_id=run_id,
        rank=0,
        step=None,
        detector=DETECTOR,
        severity="page",
        value=float(kinds.total()),
        message=f"records only the daemon writes came on {subjects} ({said}) from whoever holds this run's agent"
        " credentials: refused and dead-lettered (reason forged). Find who publishes them and rotate the"
        " credentials; further attempts from this run are only counted (vigil_forged_records_total)",
        episode=episode_id(DETECTOR, run_id, 0, 0),
    )


def _budget_page(per_hour: int, now: float) -> Anomaly:
    return Anomaly(
        time=now,
        run_id="_daemon",
        rank=0,
        step=None,
        detector=DETECTOR,
        severity="page",
        message=f"forged records came from more than {per_hour} runs within an hour: further runs are not paged"
        " this hour, only counted (vigil_forged_records_total; dead_letters, reason forged). Someone holds the"
        " agent credentials and makes up run ids: rotate them",
        episode=episode_id(DETECTOR, "_daemon", 0, int(now)),
    )
