"""The corpus: which runs to record, what fault each carries, and what should catch it.

Every run is real training (``ppo``, ``supervised``, ``gpt``, ``regression`` in this package) with at most
one fault. ``expected`` names the detectors that should catch the fault (any of them
counts) within ``budget_steps`` steps or ``budget_s`` seconds of it (either suffices; the
budgets are the detectors' latency targets). Some expected detectors are not written yet
(``PLANNED``): the evaluation reports them as missed, which is the point of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLANNED: dict[str, str] = {
    "run_failed": "a run that ended on an uncaught exception, or vanished without run_end",
    "hang": "a rank whose step counter stopped while its heartbeats go on",
    "generalisation": "validation loss rising while the training loss falls (memorisation)",
}
"""Detectors the corpus expects that the daemon does not register yet."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One recording: a workload, its flags, and the fault it carries (``none`` for a clean run)."""

    name: str
    workload: str
    """Module of this package that trains: ``ppo``, ``supervised``, ``gpt`` or ``regression``."""
    args: tuple[str, ...] = ()
    fault: str = "none"
    fault_at: int = -1
    expected: tuple[str, ...] = ()
    budget_steps: int | None = None
    budget_s: float | None = None
    ranks: int = 1
    fault_rank: int | None = None
    """The rank the fault is on (None: every rank)."""
    persistent: bool = False
    """The run stays broken after the fault: an episode that clears is a wrong all-clear."""
    essential: bool = False
    """Recorded first (``--essential``): the runs the detector work needs most."""
    note: str = ""
    seed: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return self.fault == "none"

    def argv(self) -> list[str]:
        """The workload's own flags (the recorder adds ``--fault-log``)."""
        out = [*self.args, "--seed", str(self.seed)]
        if not self.clean:
            out += ["--fault", self.fault, "--fault-at", str(self.fault_at)]
        return out


def _ppo(name: str, env: str, fault: str = "none", at: int = -1, **kw: object) -> RunSpec:
    return RunSpec(name, "ppo", ("--env", env, "--steps", "1500"), fault, at, **kw)  # type: ignore[arg-type]


def _sup(name: str, fault: str = "none", at: int = -1, **kw: object) -> RunSpec:
    return RunSpec(name, "supervised", ("--steps", "10000"), fault, at, **kw)  # type: ignore[arg-type]


def _gpt(name: str, fault: str = "none", at: int = -1, **kw: object) -> RunSpec:
    return RunSpec(name, "gpt", ("--steps", "11000"), fault, at, **kw)  # type: ignore[arg-type]


SPECS: tuple[RunSpec, ...] = (
    _ppo("ppo-cartpole-clean-s0", "CartPole-v1", essential=True),
    _ppo("ppo-cartpole-lr-x100", "CartPole-v1", "lr_x100", 600, expected=("kl_explode",), budget_steps=20,
         persistent=True, essential=True, seed=2),
    _ppo("ppo-cartpole-reward-exploit", "CartPole-v1", "reward_exploit", 700, expected=("reward_hack",),
         budget_steps=200, persistent=True, essential=True, seed=3,
         note="the fault step is the swap to the flawed reward model; the learner finds the exploit ~100-150 "
         "updates later (the 50-update budget counts from there)"),
    _ppo("ppo-cartpole-reward-swap", "CartPole-v1", "reward_swap", 700, expected=("reward_hack",), budget_steps=150,
         persistent=True, seed=8, note="the reward the learner trains on is swapped for a flawed one; the logged "
         "training reward (mean episode return) changes scale at the swap, then creeps up while the true return "
         "collapses from ~500 to ~100 some 80 updates after it (and to ~40 later)"),
    _ppo("ppo-cartpole-entropy-collapse", "CartPole-v1", "entropy_collapse", 700, expected=("reward_hack",),
         budget_steps=100, persistent=True, essential=True, seed=4),
    _sup("sup-digits-clean", essential=True),
    _sup("sup-digits-slowdown", "slowdown", 5000, expected=("slowdown",), budget_s=20.0, persistent=True,
         essential=True, note="budget: 2 windows of max(20 steps, 10 s); recorded idle, the run is ~27 s long",
         seed=1),
    _gpt("gpt-clean", essential=True),
    _gpt("gpt-hang", "hang", 1000, expected=("hang",), budget_s=90.0, essential=True,
         note="the training thread blocks 150 s; heartbeats go on", seed=1),
    _gpt("gpt-repeat-batch", "repeat_batch", 5000, expected=("generalisation",), budget_steps=300, persistent=True,
         essential=True, seed=2),
    _gpt("gpt-lr-x30", "lr_x30", 5000, expected=("loss_spike", "grad_spike"), budget_steps=5, persistent=True,
         essential=True, note="the loss settles well above its pre-fault level: a cleared episode is wrong", seed=3),
    _ppo("ppo-cartpole-clean-s1", "CartPole-v1", seed=1),
    _ppo("ppo-cartpole-lr-x50", "CartPole-v1", "lr_x50", 600, expected=("kl_explode",), budget_steps=20,
         persistent=True, seed=5),
    _ppo("ppo-cartpole-nan", "CartPole-v1", "nan", 800, expected=("non_finite",), budget_steps=0,
         note="NaN advantages: NaN loss at the fault, NaN weights, the next rollout raises", seed=6),
    _ppo("ppo-cartpole-crash", "CartPole-v1", "crash", 900, expected=("run_failed",), budget_steps=0,
         note="uncaught exception at the fault step: caught means at exit", seed=7),
    _ppo("ppo-acrobot-clean", "Acrobot-v1"),
    _ppo("ppo-acrobot-lr-x100", "Acrobot-v1", "lr_x100", 600, expected=("kl_explode",), budget_steps=20,
         persistent=True, seed=1),
    _sup("sup-digits-poison", "poison", 6000, expected=("loss_spike", "grad_spike"), budget_steps=5,
         note="one corrupted batch late in training, where the loss is ~0.001", seed=2),
    _sup("sup-digits-nan", "nan", 5000, expected=("non_finite",), budget_steps=0, persistent=True, seed=3),
    _sup("sup-digits-straggler", "straggler", 2000, expected=("straggler",), budget_s=31.0, ranks=2, fault_rank=1,
         persistent=True, note="two processes of one run; rank 1 is 1.55x slower from the fault on; budget: 2 "
         "windows, sized in steps (10 s at the run's pace), which the slow rank walks in 2 x 15.5 s", seed=4),
    RunSpec("reg-curve-clean", "regression", ("--steps", "10000"),
            note="an MSE that converges from ~2 to ~1e-6: near its floor it blips to 5-60x its recent level "
            "for five steps and more, tiny against the run's scale (healthy: no loss_spike)"),
)  # fmt: skip
"""Every recording, the essential ones first. Each run of a workload has its own seed, so the
stretches before the faults are independent clean data, not copies of the clean run."""

BY_NAME: dict[str, RunSpec] = {spec.name: spec for spec in SPECS}
