"""Stable-Baselines3 with trainvigil: PPO on CartPole; ``SB3Callback`` logs each rollout's reward and
episode length and each update's KL, entropy, learning rate and losses under the names the RL
detectors read.

    vigil up &
    python examples/integrations/sb3_ppo.py --timesteps 2048 --rollout 256
    python examples/integrations/sb3_ppo.py --without               # the same training without trainvigil

``tests/e2e/test_integrations.py`` runs this script against a real broker and daemon, and
``bench/integrations_overhead.py`` times it with and without the callback. The last line printed is
the times of its iterations (a rollout and the update after it) and the seconds ``PPO.learn`` took
(``_common.py``).
"""

from __future__ import annotations

import argparse
import time

from _common import StepTimes, add_arms, own_agent
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
    add_arms(parser, "sb3-cartpole")
    parser.add_argument("--timesteps", type=int, default=2048)
    parser.add_argument("--rollout", type=int, default=256, help="environment steps per rollout")
    args = parser.parse_args()

    times = StepTimes()
    callbacks: list[BaseCallback] = [Clock(times)]
    agent = own_agent(args)
    if not args.without:
        from trainvigil.integrations import SB3Callback

        callbacks.append(SB3Callback(run_id=args.run_id))

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=args.rollout, batch_size=64, n_epochs=4, seed=0, device="cpu")
    began = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, callback=CallbackList(callbacks))
    seconds = time.perf_counter() - began
    times.report(seconds, agent)


if __name__ == "__main__":
    main()
