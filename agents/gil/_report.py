"""The text report of a :class:`~.result.GilResult`: bars per thread, waits, hot functions, advice."""

from __future__ import annotations

from .result import GilResult

BAR = 24
HELD = 0.5
"""Above this held share, threads that want the GIL spend much of their time waiting for it."""
LONG_HOLD = 0.015
"""A p99 wait above this (seconds) with a small p50 means single long GIL holds."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _bar(share: float) -> str:
    full = round(max(0.0, min(1.0, share)) * BAR)
    return "█" * full + "·" * (BAR - full)


def advice(r: GilResult) -> list[str]:
    """Concrete next steps for what the numbers show (empty list: nothing to do)."""
    if not r.gil_enabled:
        return ["this is a free-threaded build running without the GIL: threads do not contend for it"]
    out: list[str] = []
    python = [t for t in r.threads if t.kind == "python" and t.share >= 0.2]
    contended = r.held > HELD
    if contended and python:
        names = ", ".join(f"{t.name} ({t.share:.0%})" for t in python[:3])
        out.append(
            f"pure-Python work holds the GIL in {names}: move it to processes (multiprocessing, DataLoader "
            "num_workers > 0), vectorise it (numpy/torch ops release the GIL inside their kernels), or use a "
            "free-threaded build (python3.13t) if your libraries support it"
        )
    elif contended:
        out.append(
            "the GIL is held most of the time: move pure-Python work to processes or vectorise it "
            "with numpy/torch; run with attribution (Linux) to see which thread holds it"
        )
    if r.wait_p99 > LONG_HOLD and r.wait_p99 > 3 * max(r.wait_p50, r.switch_interval):
        out.append(
            f"single long GIL holds (p99 wait {_ms(r.wait_p99)} vs switch interval {_ms(r.switch_interval)}): "
            "a C call keeps the GIL (sorted() or json on big data, a C extension); split it into smaller "
            "calls or release the GIL in the C code (Py_BEGIN_ALLOW_THREADS, Cython `with nogil`)"
        )
    if r.wait_p50 > 2 * r.switch_interval:
        out.append(
            f"threads queue for the GIL (p50 wait {_ms(r.wait_p50)} > 2x the switch interval): run fewer "
            "Python threads, or a free-threaded build (python3.13t) if your libraries support it"
        )
    return out


def render(r: GilResult) -> str:
    """The report as text (what ``detect_gil_contention`` prints)."""
    lines = [
        f"GIL contention: {r.name!r} over {r.period:.2f} s ({r.samples} probes, "
        f"switch interval {_ms(r.switch_interval)})",
        f"  GIL held ≈ {r.held:.0%} of the time   wait p50 {_ms(r.wait_p50)}  p90 {_ms(r.wait_p90)}  "
        f"p99 {_ms(r.wait_p99)}  max {_ms(r.wait_max)}",
    ]
    if r.note:
        lines.append(f"  note: {r.note}")
    if r.threads:
        lines.append(f"  {'thread':<24} {'share of held':<{BAR + 6}} {'kind':<8} cpu")
        for t in r.threads:
            lines.append(f"  {t.name[:24]:<24} {_bar(t.share)} {t.share:4.0%}  {t.kind:<8} {t.cpu:4.0%}")
        hot = [h for h in r.hot_functions[:5] if h[2] >= 0.005]
        if hot:
            lines.append("  hot functions (share of GIL-holding CPU):")
            lines.extend(f"    {share:4.0%}  {label}  [{thread}]" for thread, label, share in hot)
    steps = advice(r)
    if steps:
        lines.append("  advice:")
        lines.extend(f"    - {s}" for s in steps)
    else:
        lines.append("  no meaningful GIL contention: nothing to do")
    return "\n".join(lines)
