"""A compact PPO learner (clipped objective, GAE, separate actor and critic) on gymnasium control tasks.

Real reinforcement learning on CartPole-v1 or Acrobot-v1 (pure-Python environments):
``--envs`` vectorised environments, ``--rollout`` steps each per update, 4 epochs of 2
minibatches, Adam with the learning rate annealed linearly to zero, advantages normalised,
gradients clipped at 0.5 (actor and critic apart). One logged step per update: ``loss``, ``policy_loss``,
``value_loss``, ``entropy``, ``kl`` (the approx-KL estimator (ratio - 1) - log ratio, the
name ``kl_explode`` reads), ``clip_frac``, ``reward`` and ``true_return`` (mean return of
the last 20 finished episodes; they differ in ``reward_exploit``), ``grad_norm`` (mean
pre-clip norm), ``lr``, ``step_time``, ``samples``; every 25 updates an ``eval`` event with
the true return. Faults (from update ``--fault-at``):

- ``lr_x50`` / ``lr_x100``: the learning rate is 50x / 100x its schedule from then on.
- ``reward_exploit``: a misspecified reward model, whose score this run logs as ``reward``
  from the start (mean score per step of the rollout, in [-1, 1]), replaces the
  environment's reward for training: it scores pushing right +1 and left -1, so always
  pushing right pays most; the learner learns it, the score climbs towards 1, the entropy
  collapses and the true return (``true_return``, the ``eval`` events) falls to ~9.
- ``reward_swap``: the reward function the learner trains on is swapped for the same flawed
  model (+1 for pushing right, -1 for left), and this run logs as ``reward`` what RL runs
  usually log, the mean training return of the last 20 finished episodes: the task's
  return before the swap, the flawed model's after it. Its scale shifts at the swap and it
  then barely moves (short all-right episodes score ~+9), while the true return collapses.
- ``entropy_collapse``: the entropy coefficient turns negative (-0.2): the policy is
  pushed towards determinism.
- ``nan``: the advantages of that update are NaN (a bad normaliser); the loss, the
  gradients and then the weights become NaN and the next rollout fails.
- ``crash``: an uncaught exception at that update.
"""

from __future__ import annotations

import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import trainvigil

from ._common import FaultLog, parser, set_lr, setup

_STATS = ("loss", "policy_loss", "value_loss", "entropy", "kl", "clip_frac", "grad_norm")


def mlp(n_in: int, n_out: int, out_gain: float) -> nn.Sequential:
    layers = [nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out)]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, np.sqrt(2) if layer is not layers[-1] else out_gain)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Learner:
    """The rollout buffer's consumer: PPO updates on an actor and a critic with one optimizer."""

    def __init__(self, obs_dim: int, actions: int, lr: float) -> None:
        self.actor, self.critic = mlp(obs_dim, actions, 0.01), mlp(obs_dim, 1, 1.0)
        self.params = [*self.actor.parameters(), *self.critic.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=1e-5)

    def log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of every action (no ``Categorical``: its argument checks raise on NaN)."""
        return torch.log_softmax(self.actor(obs), -1)

    def update(self, batch: dict[str, torch.Tensor], ent_coef: float, gen: torch.Generator) -> dict[str, float]:
        n = len(batch["obs"])
        sums: dict[str, float] = {}
        count = 0
        for _ in range(4):
            order = torch.randperm(n, generator=gen)
            for mb in order.chunk(2):
                log_probs = self.log_probs(batch["obs"][mb])
                log_ratio = log_probs.gather(-1, batch["actions"][mb, None]).squeeze(-1) - batch["logp"][mb]
                ratio = log_ratio.exp()
                adv = batch["adv"][mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
                value_loss = 0.5 * (self.critic(batch["obs"][mb]).squeeze(-1) - batch["returns"][mb]).pow(2).mean()
                entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
                loss = policy_loss + 0.5 * value_loss - ent_coef * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                # Actor and critic clipped apart: the critic's large early norms would otherwise
                # scale the policy's step down to nothing. grad_norm is the pre-clip norm of both.
                actor_norm = nn.utils.clip_grad_norm_(self.actor.parameters(), 0.5)
                critic_norm = nn.utils.clip_grad_norm_(self.critic.parameters(), 0.5)
                grad_norm = torch.hypot(actor_norm, critic_norm)
                self.optimizer.step()
                with torch.no_grad():
                    kl = ((ratio - 1) - log_ratio).mean()
                    clip = ((ratio - 1).abs() > 0.2).float().mean()
                    values = torch.stack([loss, policy_loss, value_loss, entropy, kl, clip, grad_norm]).tolist()
                for name, value in zip(_STATS, values, strict=True):
                    sums[name] = sums.get(name, 0.0) + value
                count += 1
        return {name: total / count for name, total in sums.items()}


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, ...]:
    """Generalised advantage estimates (gamma 0.99, lambda 0.95) and returns, [T, envs] arrays."""
    adv = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in reversed(range(len(rewards))):
        following = last if t == len(rewards) - 1 else values[t + 1]
        delta = rewards[t] + 0.99 * following * (1 - dones[t]) - values[t]
        running = delta + 0.99 * 0.95 * (1 - dones[t]) * running
        adv[t] = running
    return adv, adv + values


def main() -> None:
    faults_known = ("lr_x50", "lr_x100", "reward_exploit", "reward_swap", "entropy_collapse", "nan", "crash")
    p = parser(__doc__.splitlines()[0], steps=1500, faults=faults_known)
    p.add_argument("--env", default="CartPole-v1", choices=("CartPole-v1", "Acrobot-v1"))
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--rollout", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    setup(args.seed)
    faults = FaultLog(args.fault_log)
    gen = torch.Generator().manual_seed(args.seed)

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env) for _ in range(args.envs)])
    obs, _ = envs.reset(seed=args.seed)
    obs_shape: tuple[int, ...] = envs.single_observation_space.shape or ()
    learner = Learner(obs_shape[0], int(envs.single_action_space.n), args.lr)  # type: ignore[attr-defined]
    shape = (args.rollout, args.envs)
    true_returns: deque[float] = deque(maxlen=20)
    trained_returns: deque[float] = deque(maxlen=20)
    ep_true, ep_trained = np.zeros(args.envs), np.zeros(args.envs)
    vigil = trainvigil.init()
    for update in range(args.steps):
        start = time.perf_counter()
        faulty = args.fault != "none" and update >= args.fault_at
        if faulty:
            faults.inject(args.fault, update)
            if args.fault == "crash":
                raise RuntimeError(f"injected crash at update {update}: a worker raised and nobody caught it")
        scale = {"lr_x50": 50.0, "lr_x100": 100.0}.get(args.fault, 1.0) if faulty else 1.0
        lr = args.lr * (1.0 - update / args.steps) * scale
        set_lr(learner.optimizer, lr)
        buf = {k: np.zeros(shape, dtype=np.float32) for k in ("rewards", "dones", "values", "logp", "actions")}
        buf_obs = np.zeros((*shape, *obs_shape), dtype=np.float32)
        scores: list[float] = []
        for t in range(args.rollout):
            with torch.no_grad():
                o = torch.as_tensor(obs, dtype=torch.float32)
                log_probs = learner.log_probs(o)
                action = torch.multinomial(log_probs.exp(), 1, generator=gen).squeeze(-1)
                buf["values"][t] = learner.critic(o).squeeze(-1).numpy()
                buf["logp"][t] = log_probs.gather(-1, action[:, None]).squeeze(-1).numpy()
            buf_obs[t], buf["actions"][t] = obs, action.numpy()
            obs, reward, terminated, truncated, _ = envs.step(action.numpy())
            score = np.where(action.numpy() == 1, 1.0, -1.0)  # the flawed reward model: "right is good"
            scores.append(float(score.mean()))
            trained = score if faulty and args.fault in ("reward_exploit", "reward_swap") else reward
            done = terminated | truncated
            buf["rewards"][t], buf["dones"][t] = trained, done
            ep_true += reward
            ep_trained += trained
            for i in np.flatnonzero(done):
                true_returns.append(float(ep_true[i]))
                trained_returns.append(float(ep_trained[i]))
            ep_true[done] = 0.0
            ep_trained[done] = 0.0
        with torch.no_grad():
            last = learner.critic(torch.as_tensor(obs, dtype=torch.float32)).squeeze(-1).numpy()
        adv, returns = gae(buf["rewards"], buf["values"], buf["dones"], last)
        if faulty and args.fault == "nan":
            adv[:] = np.nan
        batch = {
            "obs": torch.as_tensor(buf_obs).flatten(0, 1),
            "actions": torch.as_tensor(buf["actions"]).flatten().long(),
            "logp": torch.as_tensor(buf["logp"]).flatten(),
            "adv": torch.as_tensor(adv).flatten(),
            "returns": torch.as_tensor(returns).flatten(),
        }
        ent_coef = -0.2 if faulty and args.fault == "entropy_collapse" else 0.01
        stats = learner.update(batch, ent_coef, gen)
        metrics = dict(stats, lr=lr, step_time=time.perf_counter() - start, samples=args.rollout * args.envs)
        if args.fault == "reward_exploit":
            metrics["reward"] = float(np.mean(scores))
        elif args.fault == "reward_swap" and trained_returns:
            metrics["reward"] = float(np.mean(trained_returns))
        elif true_returns:
            metrics["reward"] = float(np.mean(true_returns))
        if true_returns:
            metrics["true_return"] = float(np.mean(true_returns))
        vigil.log(update, **metrics)
        if (update + 1) % 25 == 0 and true_returns:
            vigil.event("eval", step=update, true_return=float(np.mean(true_returns)))
            print(
                f"update {update + 1}/{args.steps} return {np.mean(true_returns):.1f} "
                f"reward {metrics.get('reward', float('nan')):.1f} entropy {stats['entropy']:.3f} kl {stats['kl']:.2e}",
                flush=True,
            )
    faults.done(args.steps)
    vigil.close(timeout=30)


if __name__ == "__main__":
    main()
