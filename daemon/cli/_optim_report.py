"""``vigil bench-optim``'s summary: the ranked table with intervals and Welch's test, and the loss curves' PNG.

Pure over :class:`~trainvigil.schemas.optim.OptimResult` rows (and the curves), apart from the PNG,
which needs matplotlib (imported only here, only when asked).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from trainvigil.optim.bench.stats import mean_ci, welch
from trainvigil.schemas.optim import OptimResult
from trainvigil.schemas.query import QueryResult

COLUMNS = (
    "workload", "rank", "optimizer", "final_loss", "ci95", "vs_baseline_p", "steps_to_half", "step_ms", "p95_ms",
    "state_kib", "peak_kib", "stable",
)  # fmt: skip
Curves = dict[tuple[str, str], list[list[float]]]
"""(workload, optimizer) -> the loss curve of each seed."""


def _mean(values: Sequence[float | int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or math.isnan(value) else float(f"{value:.{digits}g}")


def summary(results: Sequence[OptimResult], baseline: str) -> QueryResult:
    """One row per (workload, optimizer), ranked by mean final loss within each workload.

    ``ci95`` is the half-width of the 95% t interval of the mean over seeds; ``vs_baseline_p`` the
    two-sided p-value of Welch's t-test of the final losses against ``baseline``'s (``None`` for
    the baseline itself or with fewer than two seeds); ``stable`` counts seeds whose run at the
    higher LR drew no ``non_finite`` or ``loss_spike`` page.
    """
    groups: dict[tuple[str, str], list[OptimResult]] = defaultdict(list)
    for r in results:
        groups[(r.workload, r.optimizer)].append(r)

    def finals(key: tuple[str, str]) -> list[float]:
        return [r.final_loss for r in groups.get(key, []) if r.final_loss is not None and math.isfinite(r.final_loss)]

    rows = []
    for workload in dict.fromkeys(r.workload for r in results):
        ranked = sorted((k for k in groups if k[0] == workload), key=lambda k: (_mean(finals(k)) or math.inf, k[1]))
        for rank, key in enumerate(ranked, 1):
            runs, values = groups[key], finals(key)
            mean, half = mean_ci(values) if values else (math.nan, math.nan)
            p = None if key[1] == baseline else welch(values, finals((workload, baseline)))[1]
            stable = sum(r.stable is True for r in runs)
            factor = runs[0].unstable_lr_factor
            rows.append([
                workload, rank, key[1], _round(mean), _round(half, 2), _round(p, 2),
                _round(_mean([r.steps_to_half for r in runs]), 3),
                _round(1e3 * (_mean([r.step_time_mean_s for r in runs]) or math.nan), 3),
                _round(1e3 * (_mean([r.step_time_p95_s for r in runs]) or math.nan), 3),
                _round((_mean([r.state_bytes for r in runs]) or 0) / 1024, 4),
                _round((_mean([r.peak_bytes for r in runs]) or 0) / 1024, 4),
                f"{stable}/{len(runs)} at {factor:g}x",
            ])  # fmt: skip
    return QueryResult(columns=list(COLUMNS), rows=rows)


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing running mean over ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot(curves: Curves, path: Path) -> str:
    """Write the mean loss curve of each optimizer, one panel per workload, to ``path``; what happened, in a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no PNG written to {path}: matplotlib is not installed (pip install 'trainvigil[plot]')"
    workloads = list(dict.fromkeys(w for w, _ in curves))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        for (w, optimizer), seeds in curves.items():
            if w != workload or not seeds:
                continue
            n = min(len(s) for s in seeds)
            mean = [sum(s[i] for s in seeds) / len(seeds) for i in range(n)]
            ax.plot(_smooth(mean, max(1, n // 50)), label=optimizer, linewidth=1)
        ax.set(title=workload, xlabel="step", ylabel="loss (mean over seeds, running mean)", yscale="log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"loss curves written to {path}"
