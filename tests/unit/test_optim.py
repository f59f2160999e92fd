"""trainvigil.optim: each optimizer agrees with an independent reference, and checkpoints round-trip.

The references are test-only packages (the ``dev`` extra): ``lion-pytorch`` for Lion,
``pytorch-optimizer`` for Adan and Sophia (its ``SophiaH`` given our GNB estimates as its external
Hessian, with its ``lr``/``p``/``weight_decay`` mapped onto Sophia-G's ``rho``), and torch's own
``Muon`` + ``AdamW`` for the Muon split (torch>=2.9). A missing package skips its test with the reason.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

import pytest

if TYPE_CHECKING:  # torch is imported where it is used: collecting this module stays light
    import torch
    from torch import nn

    Hook = Callable[[torch.optim.Optimizer, torch.Tensor, int], None]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")

STEPS = 100
RTOL = 1e-5
OPTIMIZERS = ("adan", "lion", "muon", "sophia")


def _needs(module: str, package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"oracle {package} not installed (pip install {package})"
    )


@pytest.fixture
def _torch_muon() -> None:
    import torch

    if not hasattr(torch.optim, "Muon"):
        pytest.skip("oracle torch.optim.Muon needs torch>=2.9")


@pytest.fixture
def _cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


_needs_torch_muon = pytest.mark.usefixtures("_torch_muon")


def _model() -> nn.Module:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    import torch

    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 8, generator=gen), torch.randint(0, 4, (16,), generator=gen)) for _ in range(n)]


def _train(model: nn.Module, opt: torch.optim.Optimizer, batches: list, *, before_backward: Hook | None = None) -> None:
    from torch.nn import functional as F

    for step, (x, y) in enumerate(batches):
        logits = model(x)
        if before_backward is not None:
            before_backward(opt, logits, step)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(logits, y).backward()
        opt.step()


def _assert_close(ours: nn.Module, ref: nn.Module, rtol: float = RTOL) -> None:
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        rel = ((a - b).norm() / b.norm()).item()
        assert rel <= rtol, f"{name}: relative difference {rel:.2e} after {STEPS} steps"


class _LionKwargs(TypedDict):
    lr: float
    betas: tuple[float, float]
    weight_decay: float


class _AdanKwargs(TypedDict):
    lr: float
    betas: tuple[float, float, float]
    weight_decay: float
    eps: float


@_needs("lion_pytorch", "lion-pytorch")
def test_lion_matches_lion_pytorch() -> None:
    from lion_pytorch import Lion as RefLion

    from trainvigil.optim import Lion

    ours, ref = _model(), _model()
    kw: _LionKwargs = {"lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1}
    _train(ours, Lion(ours.parameters(), **kw), _batches(STEPS))
    _train(ref, RefLion(ref.parameters(), **kw), _batches(STEPS))
    _assert_close(ours, ref)


@_needs("pytorch_optimizer", "pytorch-optimizer")
def test_adan_matches_pytorch_optimizer() -> None:
    from pytorch_optimizer import Adan as RefAdan

    from trainvigil.optim import Adan

    ours, ref = _model(), _model()
    kw: _AdanKwargs = {"lr": 3e-3, "betas": (0.98, 0.92, 0.99), "weight_decay": 0.02, "eps": 1e-8}
    _train(ours, Adan(ours.parameters(), **kw), _batches(STEPS))
    _train(ref, RefAdan(ref.parameters(), weight_decouple=True, foreach=False, **kw), _batches(STEPS))
    _assert_close(ours, ref)


@_needs("pytorch_optimizer", "pytorch-optimizer")
def test_sophia_matches_pytorch_optimizer_given_the_same_gnb_estimates() -> None:
    """SophiaH's clamp(m / h, ±p) with lr/rho, p = rho and weight_decay * rho is Sophia-G's clipped step."""
    import torch
    from pytorch_optimizer import SophiaH

    from trainvigil.optim import SophiaG, gnb_loss

    lr, rho, wd, k = 1e-3, 0.04, 0.1, 5
    ours, ref = _model(), _model()
    ours_opt = SophiaG(ours.parameters(), lr=lr, rho=rho, weight_decay=wd, update_every=k, eps=1e-15)
    ref_opt = SophiaH(
        ref.parameters(),
        lr=lr / rho,
        betas=(0.965, 0.99),
        p=rho,
        weight_decay=wd * rho,
        update_period=10**9,
        eps=1e-15,
        foreach=False,
    )

    def ours_hook(opt: torch.optim.Optimizer, logits: torch.Tensor, step: int) -> None:
        assert isinstance(opt, SophiaG) and opt.hessian_due == (step % k == 0)
        if opt.hessian_due:
            opt.update_hessian(gnb_loss(logits, torch.Generator().manual_seed(step)), batch_size=len(logits))

    hessians: list[list[torch.Tensor] | None] = []

    def ref_hook(opt: torch.optim.Optimizer, logits: torch.Tensor, step: int) -> None:
        if step % k:
            hessians.append(None)
            return
        sampled = gnb_loss(logits, torch.Generator().manual_seed(step))
        grads = torch.autograd.grad(sampled, list(ref.parameters()), retain_graph=True)
        hessians.append([len(logits) * g * g for g in grads])

    class _WithHessian:
        """Hands SophiaH the estimate made for this step (its external-Hessian path)."""

        def __init__(self, inner: SophiaH) -> None:
            self.inner, self.calls = inner, 0

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.inner.zero_grad(set_to_none=set_to_none)

        def step(self) -> None:
            self.inner.step(hessian=hessians[self.calls])
            self.calls += 1

    _train(ours, ours_opt, _batches(STEPS), before_backward=ours_hook)
    _train(ref, _WithHessian(ref_opt), _batches(STEPS), before_backward=ref_hook)  # type: ignore[arg-type]
    _assert_close(ours, ref)


def _many_matrices() -> nn.Module:
    """Three 32 x 32, two tall 64 x 32 and two wide 32 x 64 weights: Muon's stacks of several matrices."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    widths = [8, 32, 32, 32, 64, 32, 64, 32, 4]
    layers = [m for w_in, w_out in itertools.pairwise(widths) for m in (nn.Linear(w_in, w_out), nn.Tanh())]
    return nn.Sequential(*layers[:-1])


@pytest.mark.timeout(200)  # 100 Muon and AdamW steps twice, stacked matrices in bfloat16: ~66 s loaded
@_needs_torch_muon
@pytest.mark.parametrize(("make", "rtol"), [(_model, 0.0), (_many_matrices, RTOL)], ids=["one-per-shape", "stacked"])
def test_muon_is_torch_muon_on_matrices_and_adamw_on_the_rest(make: Callable[[], nn.Module], rtol: float) -> None:
    """torch.optim.Muon + AdamW (fused, as ours where torch has it): a lone matrix bit for bit, a stack to 1e-5.

    A matrix alone takes torch's own 2-D ops. A stack takes the same arithmetic through 3-D matmuls,
    which may accumulate a dot product in another order (test_stacked_newton_schulz_is_torchs_per_matrix
    bounds that); over 100 steps the bfloat16 iteration would carry any such rounding far beyond
    1e-5, so this passing means every stacked step was torch's, bit for bit, on this machine.
    """
    import torch

    from trainvigil.optim import Muon

    ours, ref = make(), make()
    _train(ours, Muon(ours.parameters(), lr=0.02, weight_decay=0.01, adamw_lr=1e-3), _batches(STEPS))
    matrices = [p for p in ref.parameters() if p.ndim == 2]
    rest = [p for p in ref.parameters() if p.ndim != 2]
    muon = torch.optim.Muon(matrices, lr=0.02, weight_decay=0.01)
    adamw = torch.optim.AdamW(rest, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, fused=True)

    class _Both:
        def zero_grad(self, set_to_none: bool = True) -> None:
            ref.zero_grad(set_to_none=set_to_none)

        def step(self) -> None:
            muon.step()
            adamw.step()

    _train(ref, _Both(), _batches(STEPS))  # type: ignore[arg-type]
    _assert_close(ours, ref, rtol)


@_needs_torch_muon
def test_stacked_newton_schulz_is_torchs_per_matrix() -> None:
    """Stacked, 99.9% of elements are torch's bit for bit; the rest differ by a matmul's rounding order.

    Where a near-tie in the float32 accumulation of a 3-D matmul rounds the other way, the bfloat16
    iteration (whose own output is only that accurate) moves that matrix's result by up to ~1.3%.
    """
    import torch
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_ns

    from trainvigil.optim._newton_schulz import EPS, NS_COEFFICIENTS, NS_STEPS, orthogonalise

    gen = torch.Generator().manual_seed(0)
    equal = total = 0
    for shape in [(32, 32), (8, 32), (32, 8), (64, 32), (4, 32)]:
        stack = torch.randn(50, *shape, generator=gen) * 1e-2
        ours = orthogonalise(stack, NS_COEFFICIENTS, NS_STEPS, EPS).float()
        theirs = torch.stack([torch_ns(m, NS_COEFFICIENTS, NS_STEPS, EPS) for m in stack]).float()
        equal, total = equal + int((ours == theirs).sum()), total + ours.numel()
        rel = (ours - theirs).norm(dim=(-2, -1)) / theirs.norm(dim=(-2, -1))
        assert float(rel.max()) <= 0.02, f"{shape}: a matrix {float(rel.max()):.2e} from torch's"
    assert equal >= 0.999 * total, f"only {equal} of {total} elements are torch's"


def _sophia_hook(opt: torch.optim.Optimizer, logits: torch.Tensor, step: int) -> None:
    import torch

    from trainvigil.optim import SophiaG, gnb_loss

    if isinstance(opt, SophiaG) and opt.hessian_due:
        opt.update_hessian(gnb_loss(logits, torch.Generator().manual_seed(step)), batch_size=len(logits))


def _optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """A fresh optimizer ``name`` (one of OPTIMIZERS) over ``params``."""
    from trainvigil.optim import Adan, Lion, Muon, SophiaG

    factories: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
        "lion": lambda p: Lion(p, lr=1e-3, weight_decay=0.1),
        "adan": lambda p: Adan(p, lr=3e-3, weight_decay=0.02),
        "sophia": lambda p: SophiaG(p, lr=1e-3, update_every=3),
        "muon": lambda p: Muon(p, lr=0.02, weight_decay=0.01),
    }
    return factories[name](params)


@pytest.mark.timeout(140)  # two 100-step trainings per optimizer; Muon's ~45 s loaded
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_dict_round_trip_continues_exactly(name: str) -> None:
    """Saved at step 50 and loaded into a fresh optimizer, training goes on bit for bit as if never stopped."""
    import torch

    batches = _batches(STEPS)
    whole = _model()
    _train(whole, _optimizer(name, list(whole.parameters())), batches, before_backward=_sophia_hook)

    first = _model()
    opt = _optimizer(name, list(first.parameters()))
    _train(first, opt, batches[:50], before_backward=_sophia_hook)
    saved = copy.deepcopy({"model": first.state_dict(), "optimizer": opt.state_dict()})
    resumed = _model()
    resumed.load_state_dict(saved["model"])
    fresh = _optimizer(name, list(resumed.parameters()))
    fresh.load_state_dict(saved["optimizer"])

    def shifted(o: torch.optim.Optimizer, logits: torch.Tensor, step: int) -> None:
        _sophia_hook(o, logits, step + 50)

    _train(resumed, fresh, batches[50:], before_backward=shifted)
    for a, b in zip(resumed.parameters(), whole.parameters(), strict=True):
        assert torch.equal(a, b)


def test_lion_keeps_one_state_tensor_per_parameter() -> None:
    from trainvigil.optim import Lion

    model = _model()
    opt = Lion(model.parameters())
    _train(model, opt, _batches(1))
    assert all(set(s) == {"exp_avg"} for s in opt.state.values())
    assert len(opt.state) == len(list(model.parameters()))


def test_the_benchmark_refuses_a_device_it_cannot_use_before_any_run() -> None:
    import torch

    from trainvigil.optim.bench.workloads import check_device

    check_device("cpu", ["supervised", "rl", "quadratic"])
    with pytest.raises(ValueError, match="cpu, cuda or cuda:N"):
        check_device("mps", ["quadratic"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            check_device("cuda", ["quadratic"])
    else:
        with pytest.raises(ValueError, match="rl workload runs on the CPU only"):
            check_device("cuda", ["rl"])


@pytest.mark.usefixtures("_cuda")
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_workloads_train_on_cuda_and_their_peak_is_cudas(name: str) -> None:
    """Each optimizer steps the supervised workload on the GPU; the peak is the CUDA allocator's, state included."""
    import torch

    from trainvigil.optim.bench.memory import PeakMeter
    from trainvigil.optim.bench.workloads import Supervised

    job = Supervised(0, "cuda")
    opt = _optimizer(name, job.parameters())
    meter = PeakMeter(torch.device("cuda"))
    meter.start()
    losses = [job.step(opt)[0] for _ in range(5)]
    peak = meter.read()
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    assert all(map(torch.isfinite, torch.tensor(losses)))
    assert peak is not None and peak >= state > 0
