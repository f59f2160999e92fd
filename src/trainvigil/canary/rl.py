"""``python -m trainvigil.canary.rl``: a small actor-critic learner on a grid world, watched like a user's script.

Each update plays 32 training and 32 held-out episodes of :mod:`._grid` in one lock-step batch,
estimates advantages on the training ones (GAE, gamma 0.99, lambda 0.95, normalised), and takes
one Adam step on PPO's clipped objective plus half the value loss minus an entropy bonus,
gradients clipped at 0.5. The actor and the critic are two parameter groups of one optimizer
with a cosine learning rate (no warm-up: the KL grows with the square of the LR, and a warm-up's
rise paged ``kl_explode`` on clean runs); ``trainvigil.torch.watch()`` hooks it (``lr`` is the
policy's, ``step_time`` one update). A shorter ``--steps`` run is the start of the default one.

Logged per update, under names the detectors read: ``reward`` (mean training return per
episode), ``entropy`` (mean policy entropy over the states visited), ``kl`` (approximate KL of
the updated policy from the one that played, ``(r - 1) - log r`` over the rollout), ``true_return``
(the task's return on 32 held-out episodes, which no reward bonus reaches: the ``reward_hack``
detector compares it with ``reward``), ``episode_len``, ``policy_loss``, ``value_loss``, the
pre-clip ``grad_norm`` and ``samples``. Two names are left out on purpose: the total loss (it
hovers around 0 and changes sign, so a ratio to its median means nothing and ``loss_spike`` warned
on it), and ``response_len`` (here a longer episode is a worse one, not a padded answer: it is
``episode_len``).

Faults: ``kl_explode`` and ``reward_hack`` (:mod:`._rl_faults`), besides every kind ``watch()``
applies. One update is one step.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import trainvigil
import trainvigil.torch
from trainvigil.agents import faults

from . import WORKLOADS
from . import _grid as env
from ._common import parser, setup, warmup_cosine
from ._rl_faults import RlFaults

STEPS = WORKLOADS["rl"].steps
EPISODES = 32
ENTROPY_COEF = 0.02
ACTOR_GAIN = 1.0
"""The policy head starts at full scale, not PPO's usual 0.01: a near-uniform first policy barely
moves per update, so its KL started ~20x below its later level and paged ``kl_explode`` on clean runs."""
BETAS = (0.0, 0.999)
"""Adam without momentum (RMSProp's step): with momentum, the steady push of the ``reward_hack``
fault moved the policy 10x more per update than noisy learning did and paged ``kl_explode`` too."""


def mlp(n_out: int, out_gain: float) -> nn.Sequential:
    """Two tanh layers of 64, orthogonal initialisation (the output layer's scaled by ``out_gain``)."""
    layers = [nn.Linear(env.OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out)]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, 2**0.5 if layer is not layers[-1] else out_gain)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


def advantages(r: env.Rollout, gamma: float = 0.99, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE and returns, ``[HORIZON, n]``; an episode's end is terminal (nothing bootstrapped past it)."""
    adv = torch.zeros_like(r.rewards)
    running = torch.zeros(r.rewards.shape[1])
    following = torch.zeros(r.rewards.shape[1])
    for t in reversed(range(len(r.rewards))):
        nonterminal = r.alive[t + 1] if t + 1 < len(r.rewards) else torch.zeros_like(following)
        delta = r.rewards[t] + gamma * following * nonterminal - r.values[t]
        running = (delta + gamma * lam * nonterminal * running) * r.alive[t]
        adv[t], following = running, r.values[t]
    return adv, adv + r.values


class Learner:
    """Actor and critic with one optimizer (two groups: policy, value)."""

    def __init__(self, lr: float, gen: torch.Generator) -> None:
        self.actor, self.critic = mlp(env.ACTIONS, ACTOR_GAIN), mlp(1, 1.0)
        self.optimizer = torch.optim.Adam(
            [{"params": self.actor.parameters(), "lr": lr}, {"params": self.critic.parameters(), "lr": lr}],
            betas=BETAS,
            eps=1e-5,
        )
        self.model = nn.ModuleDict({"actor": self.actor, "critic": self.critic})
        self._gen = gen

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sampled actions, their log-probabilities and the critic's values (the rollout's policy)."""
        log_probs = torch.log_softmax(self.actor(obs), -1)
        action = torch.multinomial(log_probs.exp(), 1, generator=self._gen).squeeze(-1)
        return action, log_probs.gather(-1, action[:, None]).squeeze(-1), self.critic(obs).squeeze(-1)

    def update(self, r: env.Rollout) -> dict[str, float]:
        """One optimizer step on ``r``; the update's statistics, ``kl`` measured after the step."""
        adv, ret = advantages(r)
        live = r.alive.bool()
        obs, actions, old_logp, adv, ret = r.obs[live], r.actions[live], r.logp[live], adv[live], ret[live]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_probs = torch.log_softmax(self.actor(obs), -1)
        ratio = (log_probs.gather(-1, actions[:, None]).squeeze(-1) - old_logp).exp()
        policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
        value_loss = 0.5 * (self.critic(obs).squeeze(-1) - ret).pow(2).mean()
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        loss = policy_loss + 0.5 * value_loss - ENTROPY_COEF * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)
        self.optimizer.step()
        with torch.no_grad():
            log_ratio = torch.log_softmax(self.actor(obs), -1).gather(-1, actions[:, None]).squeeze(-1) - old_logp
            kl = ((log_ratio.exp() - 1) - log_ratio).mean()
        stats = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy, "kl": kl}
        return {"grad_norm": float(grad_norm), **{k: float(v.detach()) for k, v in stats.items()}}


def train(args: argparse.Namespace) -> None:
    """The learning loop, from ``trainvigil.init()`` to its close: one update is one step."""
    gen = setup(args.seed)
    held_out = env.goals(EPISODES, torch.Generator().manual_seed(10_000 + args.seed))
    learner = Learner(args.lr, gen)
    horizon = max(args.steps, STEPS)
    with trainvigil.init() as vigil:
        sabotage = RlFaults(faults.armed())
        trainvigil.torch.watch(learner.model, learner.optimizer, grad_norm=False)
        for step in range(args.steps):
            lr = warmup_cosine(step, horizon, warmup=1, peak=args.lr, floor=args.lr / 10)
            policy, value = learner.optimizer.param_groups
            policy["lr"], value["lr"] = lr * sabotage.lr_factor(step), lr
            # Only the first half of the batch is paid a bonus and trained on; the second is held out.
            bonus = torch.zeros(2 * EPISODES)
            bonus[:EPISODES] = sabotage.stay_bonus(step)
            both = env.play(learner.act, torch.cat([env.goals(EPISODES, gen), held_out]), bonus)
            rollout = both.episodes(slice(None, EPISODES))
            stats = learner.update(rollout)
            true_return = both.episodes(slice(EPISODES, None)).task_returns.mean()
            vigil.log(
                step,
                reward=rollout.returns.mean(),
                true_return=true_return,
                episode_len=rollout.lengths.mean(),
                samples=int(rollout.alive.sum()),
                **stats,
            )
            if (step + 1) % 100 == 0:
                print(
                    f"update {step + 1}/{args.steps} reward {rollout.returns.mean():.3f} true {true_return:.3f} "
                    f"entropy {stats['entropy']:.3f} kl {stats['kl']:.2e}",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0].split(": ", 1)[1], steps=STEPS)
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (policy and value)")
    args = p.parse_args(argv)
    faults.accept(*WORKLOADS["rl"].faults)
    train(args)


if __name__ == "__main__":
    main()
