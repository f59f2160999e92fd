"""``VIGIL_FAULT``: the plan's parsing, nothing armed without it, and each fault really happening in training."""

from __future__ import annotations

import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import wait_for
from torch_helpers import RecordingAgent, grad_of, linear_weight

import trainvigil
from trainvigil import checkpoint, faults
from trainvigil.agents import faults as plans
from trainvigil.agents.faults.hooks import GIL_THREADS
from trainvigil.errors import CheckpointIntegrityError, ConfigError

if TYPE_CHECKING:  # torch is imported where it is used: collecting this module stays light
    import torch

    from trainvigil.torch import Watch


@pytest.fixture
def arm() -> Iterator[Callable[[str], RecordingAgent]]:
    """Arms a plan for a recording agent as ``init()`` would; closes (disarms) it after the test."""
    agents: list[RecordingAgent] = []

    def armed(text: str) -> RecordingAgent:
        agent = RecordingAgent()
        assert plans.arm(faults.parse(text), agent) is faults.armed() is not None
        agents.append(agent)
        return agent

    yield armed
    for agent in agents:
        agent.close()
    assert faults.armed() is None


def _model(dtype: torch.dtype | None = None) -> torch.nn.Sequential:
    """A small model of ``dtype`` (float32 when not given)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model.to(torch.float32 if dtype is None else dtype)


def _watched(
    agent: RecordingAgent, lr: float = 0.01, dtype: torch.dtype | None = None
) -> tuple[torch.nn.Sequential, torch.optim.SGD, Watch]:
    """A model (float32 when ``dtype`` is not given), its SGD optimizer and watch() on them, logging to ``agent``."""
    import torch

    from trainvigil.torch import watch

    model = _model(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    # watch()'s own norm is float32-only: float64 models (exact arithmetic below) go without it.
    return model, opt, watch(model, opt, agent, grad_norm=dtype in (None, torch.float32))  # type: ignore[arg-type]


def _loop(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    after_backward: Callable[[int], None] = lambda _s: None,
    after_step: Callable[[int], None] = lambda _s: None,
) -> None:
    import torch

    data = torch.Generator().manual_seed(1)
    dtype = next(model.parameters()).dtype
    for step in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 8, generator=data, dtype=dtype)).pow(2).mean().backward()
        after_backward(step)
        opt.step()
        after_step(step)


# ---- the plan ------------------------------------------------------------------------------


def test_a_plan_lists_each_kind_at_its_step_with_spaces_tolerated() -> None:
    assert faults.parse("nan_grad@50") == (faults.Fault("nan_grad", 50),)
    assert faults.parse(" lr_spike@0 , gil @ 7,ckpt_corrupt@300") == (
        faults.Fault("lr_spike", 0),
        faults.Fault("gil", 7),
        faults.Fault("ckpt_corrupt", 300),
    )
    assert {f.kind for f in faults.parse(",".join(f"{k}@1" for k in faults.KINDS))} == set(faults.KINDS)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nan_gard@50", "unknown kind 'nan_gard' (did you mean 'nan_grad'?)"),
        ("NAN_GRAD@50", "unknown kind 'NAN_GRAD' (did you mean 'nan_grad'?)"),
        ("explode@5", "unknown kind 'explode'"),
        ("nan_grad", "'nan_grad' is not <kind>@<step>"),
        ("nan_grad@", "the step must be a whole number >= 0"),
        ("nan_grad@-1", "the step must be a whole number >= 0"),
        ("nan_grad@1.5", "the step must be a whole number >= 0"),
        ("nan_grad@ten", "the step must be a whole number >= 0"),
        ("nan_grad@5@6", "the step must be a whole number >= 0"),
        ("nan_grad@5,", "an empty item"),
        ("nan_grad@5,,gil@3", "an empty item"),
        (" ", "an empty item"),
        ("gil@3,gil@9", "gil given more than once"),
        ("straggler@100", "'straggler' needs a canary workload"),
        ("kl_explode@100", "'kl_explode' needs a canary workload"),
        ("reward_hack@100", "'reward_hack' needs a canary workload"),
        ("nan_grad@5\nrm -rf", "the step must be a whole number >= 0"),
    ],
)
def test_every_malformed_plan_is_one_line_naming_the_valid_kinds(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        faults.parse(text)
    message = str(info.value)
    assert says in message
    assert message.startswith(f"VIGIL_FAULT={text!r}: ") and "\n" not in message
    assert "valid kinds: nan_grad, grad_spike, lr_spike, slowdown, stall, ckpt_corrupt, gil;" in message
    assert info.value.key == "VIGIL_FAULT"


def test_nothing_is_armed_without_the_variable_and_an_empty_one_is_unset() -> None:
    assert faults.from_env({}) == () and faults.from_env({"VIGIL_FAULT": ""}) == ()
    assert faults.from_env({"VIGIL_FAULT": "stall@3"}) == (faults.Fault("stall", 3),)
    agent = trainvigil.init(run_id="no-fault", enabled=False)
    try:
        assert faults.armed() is None
    finally:
        agent.close()


def test_init_refuses_a_malformed_variable_before_starting_an_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainvigil.agents.agent import current_agent

    monkeypatch.setenv("VIGIL_FAULT", "nan_grad@fifty")
    with pytest.raises(ConfigError, match="valid kinds: nan_grad"):
        trainvigil.init(run_id="bad-fault", enabled=False)
    assert current_agent() is None and faults.armed() is None


def test_init_arms_the_variable_and_close_disarms_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_FAULT", "lr_spike@5,gil@9")
    agent = trainvigil.init(run_id="armed", enabled=False)
    plan = faults.armed()
    assert plan is not None and plan.faults == faults.parse("lr_spike@5,gil@9")
    agent.close()
    assert faults.armed() is None and plan.released.is_set()


def _hooks(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int, int]:
    """Optimizer pre- and post-step hooks, and gradient hooks on the parameters."""
    grads = sum(len(p._backward_hooks or {}) for p in model.parameters())
    return len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks), grads


def test_unarmed_watch_hooks_nothing_beyond_its_own_two_optimizer_hooks(
    arm: Callable[[str], RecordingAgent],
) -> None:
    """Without VIGIL_FAULT the hot path is watch()'s alone: no gradient hook, no extra step hook."""
    assert faults.armed() is None
    model, opt, w = _watched(RecordingAgent())
    assert _hooks(model, opt) == (1, 1, 0)
    w.remove()
    assert _hooks(model, opt) == (0, 0, 0)
    model, opt, w = _watched(arm("nan_grad@5,lr_spike@9"))
    assert _hooks(model, opt) == (2, 2, 1), "armed: one gradient hook, a step hook either side"
    w.remove()
    assert _hooks(model, opt) == (0, 0, 0), "remove() takes the fault hooks off too"


def test_a_fault_that_never_fires_is_a_fault_missed_event_not_silence(arm: Callable[[str], RecordingAgent]) -> None:
    agent = arm("nan_grad@100,ckpt_corrupt@5")
    model, opt, _ = _watched(agent, 0.1)
    _loop(model, opt, 4)
    agent.close()
    missed = {fields["kind"]: (step, fields["why"]) for step, fields in agent.of("fault_missed")}
    assert missed == {
        "nan_grad": (3, "the watched training stopped at step 3"),
        "ckpt_corrupt": (3, "no trainvigil.checkpoint.save(..., step=S) with S >= 5"),
    }
    assert agent.of("fault_injected") == []


def test_a_plan_without_watch_says_so_at_close(arm: Callable[[str], RecordingAgent]) -> None:
    agent = arm("grad_spike@3")
    agent.close()
    assert agent.of("fault_missed") == [
        (
            None,
            {
                "kind": "grad_spike",
                "planned_step": 3,
                "why": "no trainvigil.torch.watch(model, optimizer) hooked an optimizer step",
            },
        )
    ]


# ---- each fault in real training --------------------------------------------------------------


def test_nan_grad_puts_one_nan_in_one_gradient_after_backward_at_step_k(arm: Callable[[str], RecordingAgent]) -> None:
    import torch

    agent = arm("nan_grad@3")
    model, opt, w = _watched(agent, 0.1)
    nans: list[dict[str, int]] = []
    clipped: list[float] = []

    def look(step: int) -> None:
        nans.append({n: int(grad_of(p).isnan().sum()) for n, p in model.named_parameters() if grad_of(p).isnan().any()})
        clipped.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))  # the user's clip sees it

    _loop(model, opt, 4, after_backward=look)
    w.flush()
    assert nans[:4] == [{}, {}, {}, {"0.weight": 1}]
    assert all(math.isfinite(c) for c in clipped[:3]) and math.isnan(clipped[3])
    assert [math.isnan(agent.logged[s]["grad_norm"]) for s in range(4)] == [False, False, False, True]
    assert agent.of("fault_injected") == [(3, {"kind": "nan_grad", "planned_step": 3, "param": "0.weight"})]


def test_grad_spike_multiplies_every_gradient_by_1000_for_one_step(arm: Callable[[str], RecordingAgent]) -> None:
    import torch

    agent = arm("grad_spike@4")
    model, opt, _ = _watched(agent, 1e-3, torch.float64)
    twin = _model(torch.float64)
    ratios: list[float] = []
    data = torch.Generator().manual_seed(1)
    for _ in range(8):
        twin.load_state_dict(model.state_dict())  # the same weights and batch, no hooks: the true gradient
        x = torch.randn(8, 8, generator=data, dtype=torch.float64)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        twin.zero_grad()
        twin(x).pow(2).mean().backward()
        got = torch.cat([grad_of(p).flatten() for p in model.parameters()])
        true = torch.cat([grad_of(p).flatten() for p in twin.parameters()])
        ratios.append(float(got.norm() / true.norm()))
        assert torch.allclose(got, true * ratios[-1])
        opt.step()
    assert ratios == pytest.approx([1, 1, 1, 1, 1000, 1, 1, 1])
    assert agent.of("fault_injected") == [(4, {"kind": "grad_spike", "planned_step": 4, "factor": 1000.0})]


def test_lr_spike_steps_with_100x_the_scheduled_lr_from_k_on(arm: Callable[[str], RecordingAgent]) -> None:
    """The optimizer really updates with 100x the lr from step K, and a scheduler that sets lr
    outright (LambdaLR) neither undoes the spike nor compounds it."""
    import torch

    agent = arm("lr_spike@5")
    model, opt, w = _watched(agent, 1e-4, torch.float64)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    weight = linear_weight(model, 0)
    effective: list[float] = []
    scheduled: list[float] = []
    for _ in range(10):
        opt.zero_grad()
        model(torch.randn(8, 8, dtype=torch.float64)).pow(2).mean().backward()
        before, grad = weight.detach().clone(), grad_of(weight).clone()
        scheduled.append(opt.param_groups[0]["lr"])
        opt.step()
        i = int(grad.abs().argmax())
        effective.append(float((before.flatten()[i] - weight.detach().flatten()[i]) / grad.flatten()[i]))
        sched.step()
    w.flush()
    assert scheduled == pytest.approx([1e-4 * 0.9**s for s in range(10)]), "the schedule is untouched"
    expected = [lr * (100 if s >= 5 else 1) for s, lr in enumerate(scheduled)]
    assert effective == pytest.approx(expected, rel=1e-6)
    assert [agent.logged[s]["lr"] for s in range(10)] == pytest.approx(expected), "watch() logs the lr used"
    assert agent.of("fault_injected") == [(5, {"kind": "lr_spike", "planned_step": 5, "factor": 100.0})]


@pytest.mark.serial  # a ratio of step times: other processes on the cores skew it
def test_slowdown_makes_each_step_from_k_about_1_5x_slower(arm: Callable[[str], RecordingAgent]) -> None:
    agent = arm("slowdown@20")
    model, opt, _ = _watched(agent, 0.01)
    marks: list[float] = []

    def step_work(step: int) -> None:
        time.sleep(0.01)  # a steady data-loading wait, so the step's own time barely varies

    _loop(model, opt, 40, after_backward=step_work, after_step=lambda _s: marks.append(time.perf_counter()))
    took = [b - a for a, b in itertools.pairwise(marks)]  # took[i] is step i + 1
    ratio = statistics.median(took[19:]) / statistics.median(took[:18])
    assert 1.4 <= ratio <= 1.75, ratio
    assert agent.of("fault_injected") == [(20, {"kind": "slowdown", "planned_step": 20, "factor": 1.5})]


def test_stall_blocks_the_training_thread_at_step_k_until_the_agent_closes(
    arm: Callable[[str], RecordingAgent],
) -> None:
    agent = arm("stall@6")
    model, opt, _ = _watched(agent, 0.01)
    done: list[int] = []
    loop = threading.Thread(target=_loop, args=(model, opt, 10), kwargs={"after_step": done.append}, daemon=True)
    loop.start()
    wait_for(lambda: agent.of("fault_injected"), 30, "the stall")
    loop.join(timeout=1.0)
    assert loop.is_alive() and done == [0, 1, 2, 3, 4, 5], "step 6 never completes while the agent lives"
    agent.close()
    loop.join(timeout=30)
    assert not loop.is_alive() and done == list(range(10))
    assert agent.of("fault_injected") == [(6, {"kind": "stall", "planned_step": 6})]


def test_gil_starts_busy_python_threads_at_step_k(arm: Callable[[str], RecordingAgent]) -> None:
    agent = arm("gil@5")
    model, opt, _ = _watched(agent, 0.01)
    seen: list[int] = []

    def busy() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("trainvigil-fault-gil-")]

    _loop(model, opt, 8, after_step=lambda _s: seen.append(len(busy())))
    assert seen == [0] * 5 + [GIL_THREADS] * 3
    threads = busy()
    for thread in threads:
        assert thread.ident is not None
        clock = time.pthread_getcpuclockid(thread.ident)
        start = time.clock_gettime(clock)

        def burned(c: int = clock, s: float = start) -> bool:
            return time.clock_gettime(c) > s + 0.05

        wait_for(burned, 30, "each busy thread to burn CPU")
    agent.close()
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive(), "the busy threads end with the agent"
    names = [f"trainvigil-fault-gil-{i}" for i in range(GIL_THREADS)]
    assert agent.of("fault_injected") == [(5, {"kind": "gil", "planned_step": 5, "threads": names})]


def test_ckpt_corrupt_flips_the_first_save_at_or_after_k_so_its_load_fails(
    arm: Callable[[str], RecordingAgent], tmp_path: Path
) -> None:
    agent = arm("ckpt_corrupt@10")
    state = _model().state_dict()
    paths = {step: tmp_path / f"ckpt-{step}.pt" for step in (5, 10, 15)}
    checkpoint.save(state, tmp_path / "no-step.pt")
    for step, path in paths.items():
        checkpoint.save(state, path, step=step)
    checkpoint.load(tmp_path / "no-step.pt")
    checkpoint.load(paths[5])
    with pytest.raises(CheckpointIntegrityError, match="does not match its manifest"):
        checkpoint.load(paths[10])
    checkpoint.load(paths[15])  # once only
    ((injected_at, fields),) = agent.of("fault_injected")
    assert injected_at == 10 and fields["kind"] == "ckpt_corrupt" and fields["path"] == str(paths[10].resolve())
