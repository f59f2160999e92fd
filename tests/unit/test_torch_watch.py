"""``trainvigil.torch.watch`` on real torch (CPU): what it logs, when, and that it never syncs."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest
from torch_helpers import RecordingAgent, grad_of, linear_weight

from trainvigil.schemas import CheckpointDigest

if TYPE_CHECKING:  # torch is imported where it is used: collecting this module stays light
    import torch


def _model() -> torch.nn.Sequential:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )


def _train(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    before_step: Callable[[int], None] = lambda _s: None,
    step_fn: Callable[[], Any] | None = None,
) -> list[float]:
    """Run ``steps`` steps; returns the reference global grad norm of each (computed outside the hooks)."""
    import torch

    norms = []
    for step in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        before_step(step)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
        (step_fn or opt.step)()
    return norms


def test_logs_grad_norm_lr_and_step_time_under_its_step_numbers() -> None:
    import torch

    from trainvigil.torch import watch

    model, agent = _model(), RecordingAgent()
    groups: list[dict[str, Any]] = [{"params": model[0].parameters()}, {"params": model[2:].parameters(), "lr": 0.5}]
    opt = torch.optim.SGD(groups, lr=0.1)
    w = watch(model, opt, agent, start_step=100)  # type: ignore[arg-type]
    norms = _train(model, opt, 5)
    w.flush()
    assert sorted(agent.logged) == [100, 101, 102, 103, 104]
    for i, step in enumerate(range(100, 105)):
        m = agent.logged[step]
        assert m["grad_norm"] == pytest.approx(norms[i], rel=1e-5)
        assert m["lr"] == 0.1 and m["lr_group1"] == 0.5
        assert ("step_time" in m) == (i > 0), "step time needs a previous step boundary"
        assert m.get("step_time", 1.0) > 0
    assert w.step == 105


def test_a_float64_model_gets_its_grad_norm_too() -> None:
    """``_foreach_norm`` cannot narrow float64 to float32: half precision is widened, float64 kept."""
    import torch

    from trainvigil.torch import watch

    torch.manual_seed(0)
    model, agent = torch.nn.Linear(16, 1).double(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, agent)  # type: ignore[arg-type]
    opt.zero_grad()
    model(torch.randn(8, 16, dtype=torch.float64)).pow(2).mean().backward()
    reference = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None))
    opt.step()
    w.flush()
    assert agent.logged[0]["grad_norm"] == pytest.approx(reference, rel=1e-5)


def test_every_logs_only_every_kth_step_and_grad_norm_false_skips_the_reduction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from trainvigil.torch import watch

    model, agent = _model(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = Counter[str]()
    real = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda *a, **k: calls.update(["norm"]) or real(*a, **k))
    w = watch(model, opt, agent, every=3, grad_norm=False)  # type: ignore[arg-type]
    _train(model, opt, 7)
    w.flush()
    assert sorted(agent.logged) == [0, 3, 6]
    assert all("grad_norm" not in m and "lr" in m for m in agent.logged.values())
    assert calls["norm"] == 0, "grad_norm=False must not reduce the gradients"


def test_nan_in_one_gradient_at_step_n_reports_a_non_finite_norm_at_n_and_names_the_layer() -> None:
    import torch

    from trainvigil.torch import watch

    model, agent = _model(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, agent, layer_norms_every=1, top_layers=2)  # type: ignore[arg-type]

    def inject(step: int) -> None:
        if step == 6:
            grad_of(linear_weight(model, 2))[3, 4] = float("nan")

    _train(model, opt, 9, before_step=inject)
    w.flush()
    bad = [s for s, m in agent.logged.items() if not math.isfinite(m["grad_norm"])]
    assert bad[0] == 6 and len(agent.logged) == 9, "first non-finite norm at the step of the NaN (later ones follow it)"
    assert math.isnan(agent.logged[6]["grad_norm/2"]), agent.logged[6]
    assert all(math.isfinite(v) for k, v in agent.logged[5].items() if k.startswith("grad_norm"))
    assert len([k for k in agent.logged[6] if k.startswith("grad_norm/")]) == 2, "top 2 layers only"


def test_grad_scaler_reports_loss_scale_and_skipped_steps() -> None:
    import torch

    from trainvigil.torch import watch

    model, agent = _model(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    w = watch(model, opt, agent, scaler=scaler)  # type: ignore[arg-type]
    for step in range(4):
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
        if step == 2:
            grad_of(linear_weight(model, 0))[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
    w.flush()
    assert [agent.logged[s]["step_skipped"] for s in range(4)] == [0.0, 0.0, 1.0, 0.0]
    assert [agent.logged[s]["loss_scale"] for s in range(4)] == [1024.0, 1024.0, 1024.0, 512.0]
    w.remove()
    assert "step" not in vars(scaler), "remove() restores the scaler"


def test_host_scalars_reuse_their_slots_and_fall_back_to_fresh_memory_when_out_of_them() -> None:
    import torch

    from trainvigil.agents._host_copy import HostScalars

    scalars, taken = HostScalars(2, pinned=False), list[int]()
    a, b = scalars.copy(torch.tensor(1.5), taken), scalars.copy(torch.tensor([2.5]), taken)
    assert (float(a), float(b), scalars.free, sorted(taken)) == (1.5, 2.5, 0, [0, 1])
    source = torch.tensor(3.5)
    c = scalars.copy(source, taken)  # no slot left: a copy of its own, not the source itself
    wide = scalars.copy(torch.tensor(0.1, dtype=torch.float64), [])  # float64 is kept, in memory of its own
    source.fill_(0.0)
    assert (float(c), wide.dtype, float(wide), len(taken)) == (3.5, torch.float64, 0.1, 2)
    scalars.release(taken)
    assert (scalars.free, taken) == (2, [])
    d = scalars.copy(torch.tensor(4.5), taken)
    assert float(d) == 4.5 and float(a) + float(b) in (1.5 + 4.5, 4.5 + 2.5), "a released slot is written again"
    mine = torch.tensor(5.5)
    same = scalars.copy(mine, taken, fresh=True)
    assert same.data_ptr() == mine.data_ptr() and len(taken) == 1, "a fresh CPU value needs no copy"
    g = scalars.copy(torch.tensor(2.0, requires_grad=True) * 3, taken)
    assert (float(g), g.requires_grad, scalars.free) == (6.0, False, 0), "a slot never joins a graph"


def test_a_long_run_gives_every_host_slot_back_and_logs_each_steps_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logged steps give their slots back once read, unlogged ones (``every=3``) at once: nothing leaks over
    more steps than there are slots, and each step's values are its own, read from reused slots."""
    import torch

    from trainvigil.agents import torch_watch
    from trainvigil.torch import watch

    monkeypatch.setattr(torch_watch, "SLOTS", 4)
    model, agent = _model(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.01))  # a tensor lr: a slot too
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)  # the scale moves
    w = watch(model, opt, agent, every=3, scaler=scaler)  # type: ignore[arg-type]
    scales: list[float] = []
    norms: list[float] = []
    for _ in range(30):
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
        scales.append(float(scaler.get_scale()))
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)) / scales[-1])  # as unscaled
        scaler.step(opt)
        scaler.update()
    w.flush()
    assert sorted(agent.logged) == list(range(0, 30, 3))
    for s in range(0, 30, 3):
        m = agent.logged[s]
        assert m["grad_norm"] == pytest.approx(norms[s], rel=1e-5)
        assert (m["loss_scale"], m["lr"]) == (scales[s], pytest.approx(0.01))
    assert len(set(scales)) > 3, "the scale changed while slots were reused"
    assert w._scalars.free == 4


_SYNCS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__index__", "__format__")


@contextmanager
def _count_syncs(counts: Counter[str], armed: list[bool]) -> Iterator[None]:
    """Count calls that read a tensor's value on the host (a device sync on GPU) while ``armed``."""
    import torch

    saved = {name: getattr(torch.Tensor, name) for name in _SYNCS}

    def tracker(name: str) -> Callable[..., Any]:
        real = saved[name]

        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if armed[0]:
                counts[name] += 1
            return real(self, *args, **kwargs)

        return call

    real_sync = torch.cuda.synchronize
    for name in _SYNCS:
        setattr(torch.Tensor, name, tracker(name))
    torch.cuda.synchronize = lambda *a, **k: counts.update(["cuda.synchronize"])  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.cuda.synchronize = real_sync


def test_watched_steps_read_no_tensor_value_on_the_training_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece of watch() that runs on the training thread is armed; AdamW and GradScaler
    read values themselves (their own syncs), so the count covers watch()'s code only."""
    import torch

    from trainvigil.agents import torch_watch
    from trainvigil.torch import watch

    counts: Counter[str] = Counter()
    armed = [False]

    def arm(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            armed[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                armed[0] = False

        return call

    for name in ("_pre", "_finish_step", "_collect", "_drain"):
        monkeypatch.setattr(torch_watch.Watch, name, arm(getattr(torch_watch.Watch, name)))
    monkeypatch.setattr(torch_watch.Parity, "take", arm(torch_watch.Parity.take))
    monkeypatch.setattr(torch_watch, "to_host", arm(torch_watch.to_host))
    monkeypatch.setattr(torch_watch.HostScalars, "copy", arm(torch_watch.HostScalars.copy))

    model, agent = _model(), RecordingAgent()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    w = watch(model, opt, agent, layer_norms_every=2, parity_every=3, scaler=scaler)  # type: ignore[arg-type]

    def user_step() -> None:
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()

    with _count_syncs(counts, armed):
        for _ in range(7):
            user_step()
        # The tracker itself can fail: an .item() inside watch's hook is caught.
        hooks = opt._optimizer_step_pre_hooks
        key, real_pre = next(iter(hooks.items()))

        def syncing_pre(*args: Any) -> None:
            linear_weight(model, 0).sum().item()
            real_pre(*args)

        hooks[key] = arm(syncing_pre)
        user_step()
        assert counts.pop("item", 0) == 1, "the tracker sees an .item() inside the hook"
        hooks[key] = real_pre
        user_step()
    w.flush()
    assert counts == Counter(), f"watch() read tensor values on the training thread: {counts}"
    assert len(agent.logged) == 9 and all("grad_norm" in m and "loss_scale" in m for m in agent.logged.values())


def test_parity_digests_are_published_every_n_steps_off_the_training_thread() -> None:
    import torch

    from trainvigil.torch import watch

    model, agent = _model(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, agent, parity_every=4)  # type: ignore[arg-type]
    snapshots = {}

    def remember(*_: Any) -> None:
        if (w.step - 1) % 4 == 0:  # after watch's own post hook advanced the step
            snapshots[w.step - 1] = {n: p.detach().clone() for n, p in model.named_parameters()}

    opt.register_step_post_hook(remember)
    _train(model, opt, 10)
    w.flush()
    records = sorted(agent.emitted, key=lambda r: r.step)
    # A copy is skipped (counted) when hashing falls MAX_IN_FLIGHT copies behind, as on a loaded machine.
    assert {r.step for r in records} <= {0, 4, 8} and records[0].step == 0
    assert w.parity is not None
    assert len(records) + w.parity.skipped == 3
    from trainvigil import checkpoint

    for r in records:
        assert isinstance(r, CheckpointDigest) and r.origin == "parity"
        assert r.step is not None
        assert r.root == checkpoint.digest(snapshots[r.step]).root, "the digest is of the parameters at that step"
    assert len(records) < 2 or records[0].root != records[1].root


def test_remove_takes_the_hooks_off() -> None:
    import torch

    from trainvigil.torch import watch

    model, agent = _model(), RecordingAgent()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, opt, agent)  # type: ignore[arg-type]
    _train(model, opt, 2)
    w.remove()
    _train(model, opt, 2)
    assert sorted(agent.logged) == [0, 1]
    assert agent.before_close == []
