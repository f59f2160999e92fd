"""The RL canary's environment: walk to a goal on a small grid, many episodes at once (torch, no gym).

An episode starts in the centre of a ``SIZE`` x ``SIZE`` grid with a goal in another cell; the
agent sees its cell and the goal's (one-hot per coordinate) and moves left, right, down, up or
stays. Reaching the goal pays 1 and ends the episode; after ``HORIZON`` moves it ends with
nothing. Wherever the goal is off both axes two moves are equally good, so a trained policy
keeps some entropy (as CartPole's does) instead of collapsing onto one action: a collapse is
then a symptom, which is what the ``reward_hack`` detector looks for. Every episode of a batch
runs in lock-step as one tensor, so a rollout of 32 episodes costs a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

SIZE = 7
HORIZON = 16
MOVES = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1], [0, 0]])
"""left, right, down, up, stay"""
ACTIONS = len(MOVES)
STAY = 4
OBS = 4 * SIZE

Policy = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""Observations → (sampled actions, their log-probabilities, value estimates), without gradients."""


@dataclass(frozen=True, slots=True)
class Rollout:
    """One batch of episodes, ``[HORIZON, n]`` tensors; ``alive`` marks the moves that happened."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    """What the training reward paid for each move (the task's, plus any bonus the reward model adds)."""
    task: torch.Tensor
    """What the task paid: 1 for reaching the goal."""
    alive: torch.Tensor

    def episodes(self, which: slice) -> Rollout:
        """The rollout of some of the episodes (a slice of the batch)."""
        return Rollout(**{f.name: getattr(self, f.name)[:, which] for f in fields(self)})

    @property
    def returns(self) -> torch.Tensor:
        """Training return per episode."""
        return (self.rewards * self.alive).sum(0)

    @property
    def task_returns(self) -> torch.Tensor:
        return (self.task * self.alive).sum(0)

    @property
    def lengths(self) -> torch.Tensor:
        return self.alive.sum(0)


def goals(n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` goal cells as ``[n, 2]`` coordinates, never the start."""
    centre = SIZE * SIZE // 2
    cell = (centre + torch.randint(1, SIZE * SIZE, (n,), generator=gen)) % (SIZE * SIZE)
    return torch.stack([cell % SIZE, cell // SIZE], dim=-1)


def observe(pos: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(SIZE)
    return torch.cat([eye[pos[:, 0]], eye[pos[:, 1]], eye[goal[:, 0]], eye[goal[:, 1]]], dim=-1)


def play(policy: Policy, goal: torch.Tensor, stay_bonus: torch.Tensor | float = 0.0) -> Rollout:
    """Play one episode per goal with ``policy``; ``stay_bonus`` (per episode, or one for all) is what a
    flawed reward model adds for each ``stay`` (the ``reward_hack`` fault: it pays for the no-op, never
    for the task)."""
    n = len(goal)
    pos = torch.full((n, 2), SIZE // 2)
    alive = torch.ones(n, dtype=torch.bool)
    shape = (HORIZON, n)
    out = {k: torch.zeros(shape) for k in ("logp", "values", "rewards", "task", "alive")}
    obs, actions = torch.zeros((*shape, OBS)), torch.zeros(shape, dtype=torch.long)
    for t in range(HORIZON):
        o = observe(pos, goal)
        action, logp, value = policy(o)
        moved = (pos + MOVES[action]).clamp(0, SIZE - 1)
        reached = (moved == goal).all(-1) & alive
        task = reached.float()
        obs[t], actions[t] = o, action
        out["logp"][t], out["values"][t], out["alive"][t] = logp, value, alive.float()
        out["task"][t], out["rewards"][t] = task, task + stay_bonus * (action == STAY).float()
        pos = torch.where(alive[:, None], moved, pos)
        alive = alive & ~reached
        if not alive.any():
            break
    return Rollout(obs=obs, actions=actions, **out)
