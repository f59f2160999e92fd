"""Teams of agents limited to their own runs: the ``--team NAME=RUN,...`` form, and the file that keeps them.

The file (``teams.json`` beside the credentials, mode 0600) is what the server configuration is written
from at every start, so ``vigil up --auth`` and a later ``vigil auth DIR`` keep the teams; giving a team
again replaces its runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainvigil.errors import ConfigError
from trainvigil.schemas.limits import MAX_NAME
from trainvigil.schemas.subjects import run_token

TEAMS_FILE = "teams.json"
TEAM_USER_PREFIX = "agent-"
_TEAM = re.compile(r"[A-Za-z0-9_-]{1,58}")
"""A team name: ``agent-<name>`` must be a user name (one subject token, 64 characters at most)."""


@dataclass(frozen=True)
class Team:
    """The agents of one team: a user of their own that may publish records of ``runs`` only."""

    name: str
    runs: tuple[str, ...]

    @property
    def user(self) -> str:
        """Its user on the bus, and the name of its credentials file: ``agent-<name>``."""
        return f"{TEAM_USER_PREFIX}{self.name}"

    @property
    def tokens(self) -> tuple[str, ...]:
        """Its runs as subject tokens (``vision/2`` → ``vision_2``), each once, in order."""
        return tuple(dict.fromkeys(run_token(run) for run in self.runs))


def make_team(name: str, runs: Iterable[str]) -> Team:
    """A :class:`Team`, checked.

    Raises:
        ValueError: a name that is not 1-58 of ``A-Z a-z 0-9 _ -``, no run id, or an empty or overlong one.
    """
    ids = tuple(runs)
    if not _TEAM.fullmatch(name):
        raise ValueError(f"team name {name!r} must be 1-58 of A-Z a-z 0-9 _ -")
    if not ids or not all(ids):
        raise ValueError(f"team {name}: an empty run id; give NAME=RUN[,RUN...], run ids separated by one comma")
    if long := [run for run in ids if len(run) > MAX_NAME]:
        raise ValueError(f"team {name}: run id {long[0][:40]!r}... is longer than {MAX_NAME} characters")
    return Team(name, ids)


def parse_team(text: str) -> Team:
    """``NAME=RUN[,RUN...]`` as a :class:`Team` (see :func:`make_team`).

    Raises:
        ValueError: not that form, or what :func:`make_team` refuses.
    """
    name, sep, runs = text.partition("=")
    if not sep or not runs.strip():
        raise ValueError(f"a team is NAME=RUN[,RUN...] (the run ids its agents may publish), not {text!r}")
    return make_team(name.strip(), (run.strip() for run in runs.split(",")))


def read_teams(directory: Path) -> dict[str, Team]:
    """The teams kept in ``directory`` (none without the file), by name.

    Raises:
        ConfigError: the file cannot be read or is not what :func:`teams_text` writes.
    """
    path = directory / TEAMS_FILE
    try:
        tree = json.loads(path.read_text())
        teams = [make_team(name, runs) for name, runs in tree["teams"].items()]
        if not all(isinstance(run, str) for team in teams for run in team.runs):
            raise TypeError("run ids must be strings")
        return {team.name: team for team in teams}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} is not a teams file ({exc}); fix it or remove it and give the teams again (vigil auth DIR --team)",
            key="teams",
        ) from None


def teams_text(teams: Iterable[Team]) -> str:
    """The file :func:`read_teams` reads."""
    return json.dumps({"teams": {team.name: list(team.runs) for team in teams}}, indent=2) + "\n"
