"""Stable-Baselines3 with trainvigil: PPO on CartPole; ``SB3Callback`` logs each rollout's reward and
episode length and each update's KL, entropy, learning rate and losses under the names the RL
detectors read.

    vigil up &
    python examples/integrations/sb3_ppo.py --timesteps 2048 --rollout 256
    python examples/integrations/sb3_ppo.py --without               # the same training without trainvigil

``tests/test_integrations.py`` runs this script against a real broker and daemon, and
``bench/integrations_overhead.py`` times it with and without the callback. The last line printed is
the seconds ``PPO.learn`` took.
"""

from __future__ import annotations

import argparse
import time

from stable_baselines3 import PPO


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

    callback = agent = None
    if not args.without:
        import trainvigil
        from trainvigil.integrations import SB3Callback

        if args.init_first:
            agent = trainvigil.init(run_id=args.run_id)
            agent.flush(10)  # connected, the run's start acknowledged: start-up is over before training
        callback = SB3Callback(run_id=args.run_id)

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=args.rollout, batch_size=64, n_epochs=4, seed=0, device="cpu")
    began = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, callback=callback)
    seconds = time.perf_counter() - began
    if agent is not None:  # the script's own agent is the script's to close
        agent.close()
    print(seconds)


if __name__ == "__main__":
    main()
