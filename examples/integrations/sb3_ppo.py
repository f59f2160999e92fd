"""Stable-Baselines3 with trainvigil: PPO on CartPole; ``SB3Callback`` logs each rollout's reward and
episode length and each update's KL, entropy, learning rate and losses under the names the RL
detectors read.

    vigil up &
    python examples/integrations/sb3_ppo.py --timesteps 2048 --rollout 256
    python examples/integrations/sb3_ppo.py --without               # the same training without trainvigil

``tests/test_integrations.py`` runs this script against a real broker and daemon, and
``bench/integrations_overhead.py`` times it with and without the callback. The last line printed is
the times of its iterations (a rollout and the update after it) and the seconds ``PPO.learn`` took
(``_timing.py``).
"""

from __future__ import annotations

import argparse
import time

from _timing import StepTimes
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList


class Clock(BaseCallback):
    """Marks the start of every rollout: the gaps are whole iterations (with or without trainvigil alike)."""

    def __init__(self, times: StepTimes) -> None:
        super().__init__()
        self.times = times

    def _on_rollout_start(self) -> None:
        self.times.mark()

    def _on_step(self) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description="PPO on CartPole with trainvigil's SB3Callback")
    parser.add_argument("--run-id", default="sb3-cartpole")
    parser.add_argument("--timesteps", type=int, default=2048)
    parser.add_argument("--rollout", type=int, default=256, help="environment steps per rollout")
    parser.add_argument("--without", action="store_true", help="train without trainvigil (the baseline)")
    parser.add_argument(
        "--init-first",
        action="store_true",
        help="start the agent with trainvigil.init() before training; the callback logs through it",
    )
    args = parser.parse_args()

    times = StepTimes()
    callbacks: list[BaseCallback] = [Clock(times)]
    agent = None
    if not args.without:
        import trainvigil
        from trainvigil.integrations import SB3Callback

        if args.init_first:
            agent = trainvigil.init(run_id=args.run_id)
            agent.flush(10)  # connected, the run's start acknowledged: start-up is over before training
        callbacks.append(SB3Callback(run_id=args.run_id))

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=args.rollout, batch_size=64, n_epochs=4, seed=0, device="cpu")
    began = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, callback=CallbackList(callbacks))
    seconds = time.perf_counter() - began
    if agent is not None:  # the script's own agent is the script's to close
        agent.close()
    times.report(seconds)


if __name__ == "__main__":
    main()
