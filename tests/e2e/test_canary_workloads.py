"""The canary workloads: real training through a real nats-server and daemon.

Each workload run clean raises nothing at all; each fault kind on its workload is caught by its
detector at or after the injection, and no other detector pages. The runs of a phase run side by
side, the way a canary schedule runs them:

* ``steps_phase``: every fault judged by steps (and the GIL) and the clean supervised and RL runs,
  on one daemon with the default configuration;
* ``time_phase``: the faults judged by wall-clock windows, each window cut from 30-60 s to 2-3 s
  in the configuration of the daemon that judges it: ``slowdown`` and ``stall`` (→ ``hang``) on
  one daemon, ``straggler`` and the clean two-rank run on another.

Latencies are printed (``pytest -s``) as ``canary <fault>: ...``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pytest
from support import Daemon, NatsServer, gone, stat_fields, terminate_together, wait_for

from trainvigil.agents import faults
from trainvigil.canary import WORKLOADS
from trainvigil.errors import ConfigError

EXPECTED = {
    "nan_grad": "non_finite",
    "grad_spike": "grad_spike",
    "lr_spike": "loss_spike",
    "slowdown": "slowdown",
    "stall": "hang",  # the loop blocks while heartbeats go on: a live process that stopped stepping
    "ckpt_corrupt": "ckpt_mismatch",
    "gil": "gil_contention",
    "straggler": "straggler",
    "kl_explode": "kl_explode",
    "reward_hack": "reward_hack",
}
"""The detector each fault kind must page."""

Spec = tuple[str, str | None, tuple[str, ...]]
"""A canary: workload, ``VIGIL_FAULT`` (None: clean), arguments."""

STEPS_PHASE: dict[str, Spec] = {
    "clean-supervised": ("supervised", None, ("--steps", "300")),
    "clean-rl": ("rl", None, ("--steps", "160")),
    "nan_grad": ("supervised", "nan_grad@100", ("--steps", "130")),
    # Two independent faults in one run (a bit flipped in a saved file; one clipped gradient x1000).
    "grad_spike+ckpt_corrupt": (
        "supervised",
        "grad_spike@100,ckpt_corrupt@100",
        ("--steps", "130", "--ckpt-every", "50"),
    ),
    "lr_spike": ("supervised", "lr_spike@100", ("--steps", "130")),
    "gil": ("supervised", "gil@100", ("--steps", "140")),
    "kl_explode": ("rl", "kl_explode@50", ("--steps", "60")),
    "reward_hack": ("rl", "reward_hack@130", ("--steps", "200")),
}
"""By run id."""

SLOWDOWN_WINDOWS = {"VIGIL_DETECTORS_SLOWDOWN_MIN_SECONDS": "3", "VIGIL_DETECTORS_HANG_MIN_SECONDS": "3"}
WAIT = ("--input-wait", "0.03")
"""Steps of ~32 ms that are mostly waiting on input: a busy neighbour barely moves them (as 2 ms of compute
alone, it made them up to 2x slower for seconds), so the windows judge the fault, not the machine."""
SLOWDOWN_PHASE: dict[str, Spec] = {
    # The fault lands after the first 3 s window (the reference) and before the second is judged: no
    # two slow windows, so no episode, can come before it, whatever the machine does meanwhile.
    "slowdown": ("supervised", "slowdown@110", ("--steps", "240", *WAIT)),
    "stall": ("supervised", "stall@50", ("--steps", "240", *WAIT)),
}
STRAGGLER_WINDOWS = {"VIGIL_DETECTORS_STRAGGLER_MIN_SECONDS": "2"}
RANKS_WAIT = ("--input-wait", "0.06")
"""The two-rank runs' steps, ~62 ms: in 2 s windows, on a 2-core machine that runs both phases' daemons and
canaries at once, steps of ~32 ms still got a clean rank paged a straggler now and then (CI, 1 run in 2 to 4): what
a busy neighbour adds to a step is a smaller share of a longer one. The straggler's fault makes its steps 1.5x
as long either way."""
RANKS_PHASE: dict[str, Spec] = {
    "straggler": ("two_rank", "straggler@20", ("--steps", "160", *RANKS_WAIT)),
    "clean-two_rank": ("two_rank", None, ("--steps", "160", *RANKS_WAIT)),
}

AGENT_ENV = {"VIGIL_FLUSH_INTERVAL": "0.1", "VIGIL_HEARTBEAT_INTERVAL": "0.5", "VIGIL_GIL_INTERVAL": "0.5"}


@dataclass
class Canary:
    """One workload process (for two_rank: its launcher), with its log file."""

    run_id: str
    workload: str
    fault: str | None
    args: tuple[str, ...]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    wall: float = 0.0

    def start(self, nats_url: str, spill: Path) -> None:
        env = {**os.environ, **AGENT_ENV, "VIGIL_NATS_URL": nats_url, "VIGIL_RUN_ID": self.run_id}
        env["VIGIL_SPILL_DIR"] = str(spill)
        env["PYTHONFAULTHANDLER"] = "1"  # a SIGABRT writes every thread's stack into the log (see dump)
        env.pop(faults.ENV, None)
        if self.fault is not None:
            env[faults.ENV] = self.fault
        command = [sys.executable, "-m", WORKLOADS[self.workload].module, *self.args]
        with self.log.open("wb") as log:
            # Its own process group, as a canary runner starts it: killing the group leaves no rank behind.
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()

    def exited(self) -> bool:
        """Whether the process ended (its wall time is then known)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            return False
        self.wall = self.wall or time.monotonic() - self.started
        return True

    def dump(self) -> str:
        """A canary that should have exited: SIGABRT to its process group, so that each process's fault
        handler writes where every thread is into the log; returns the log's tail."""
        if self.proc is not None and self.proc.poll() is None:
            for pid in _group(self.proc.pid):  # one at a time: the processes share the log
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
                with contextlib.suppress(TimeoutError):
                    wait_for(functools.partial(gone, pid), 10, f"process {pid} to abort")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        return _stacks(self.log.read_text(errors="replace")) or _log(self)

    def kill(self) -> None:
        """SIGKILL to its process group (two_rank's ranks too)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self.exited()


@dataclass
class Phase:
    """What the daemons of a phase stored, read from their files once they exited."""

    canaries: dict[str, Canary] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    anomalies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gil_samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


_TABLES = {
    "anomalies": "select run_id, rank, step, epoch(time) as t, detector, severity, message from anomalies",
    "events": "select run_id, rank, step, epoch(time) as t, kind, json_extract_string(fields, '$.kind') as fault "
    "from events where kind like 'fault_%'",
    "gil_samples": "select run_id, epoch(time) as t, held, wait_p50, switch_interval from gil_samples",
}


class Stack:
    """A nats-server and a daemon of their own (so their detector windows are their own), and the canaries
    sent to them; ``close`` drains the daemon and reads what it stored into ``phase``."""

    def __init__(self, root: Path, name: str, env: dict[str, str], phase: Phase) -> None:
        self.root, self.phase = root / name, phase
        self.nats = NatsServer(self.root / "jetstream")
        self.daemon = Daemon(self.nats.url, self.root / "data", env=env)

    def start(self) -> None:
        self.boot()
        self.daemon.wait_ready()

    def boot(self) -> None:
        """The broker started, the daemon launched (:meth:`Daemon.wait_ready` then): stacks launched side by side
        start up at the same time."""
        self.root.mkdir()
        self.nats.start()
        self.daemon.launch()

    def launch(self, specs: dict[str, Spec]) -> dict[str, Canary]:
        canaries = {run_id: Canary(run_id, *spec, self.root / f"{run_id}.log") for run_id, spec in specs.items()}
        for canary in canaries.values():
            canary.start(self.nats.url, self.root / "spill")
        self.phase.canaries.update(canaries)
        return canaries

    def finish(self, canaries: dict[str, Canary]) -> None:
        """Wait for each process, then for the clean end of each run that exited 0 to be committed."""
        try:
            wait_for(lambda: all([c.exited() for c in canaries.values()]), 180, "the canaries to exit")
        except TimeoutError:
            stuck = {run_id: c.dump() for run_id, c in canaries.items() if not c.exited()}
            raise AssertionError(f"canaries still running after 180 s: {stuck}") from None
        self.phase.codes.update({run_id: c.proc.returncode for run_id, c in canaries.items() if c.proc is not None})
        ended = [r for r in canaries if self.phase.codes[r] == 0]
        quoted = ", ".join(f"'{r}'" for r in ended)
        sql = f"select count(*) from runs where run_id in ({quoted}) and status = 'ok'"
        wait_for(lambda: not ended or self.daemon.scalar(sql) == len(ended), 60, f"the ends of {ended}")

    def close(self) -> None:
        assert self.daemon.terminate() == 0  # drains and commits: what follows is final
        self.read()

    def read(self) -> None:
        """What the daemon stored, into ``phase`` (once it exited)."""
        with duckdb.connect(str(self.daemon.data_dir / "vigil.duckdb"), read_only=True) as con:
            for table, sql in _TABLES.items():
                cursor = con.execute(sql + " order by t")
                names = [d[0] for d in cursor.description]
                for row in cursor.fetchall():
                    getattr(self.phase, table).setdefault(row[0], []).append(dict(zip(names, row, strict=True)))

    def stop(self) -> None:
        """Whatever is still running after a failure: killed, not left behind."""
        for canary in self.phase.canaries.values():
            canary.kill()
        if self.daemon.process is not None and self.daemon.process.poll() is None:
            self.daemon.kill()
        self.nats.stop()


@pytest.fixture(scope="module")
def steps_phase(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phase]:
    """Every step-judged fault and the clean supervised and RL runs, side by side, default detectors."""
    phase = Phase()
    stack = Stack(tmp_path_factory.mktemp("canary"), "steps", {}, phase)
    try:
        stack.start()
        stack.finish(stack.launch(STEPS_PHASE))
        stack.close()
        yield phase
    finally:
        stack.stop()


def _hung(daemon: Daemon) -> bool:
    return bool(daemon.scalar("select count(*) from anomalies where run_id = 'stall' and detector = 'hang'"))


@pytest.fixture(scope="module")
def time_phase(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phase]:
    """``slowdown`` beside a ``stall`` on one daemon, the two-rank runs on another, at the same time.

    Each daemon shortens only the windows its runs are judged by: a straggler is also slower than
    its own first steps, and a slowdown of one rank is no straggler's business.
    """
    root, phase = tmp_path_factory.mktemp("canary"), Phase()
    one = Stack(root, "slowdown", SLOWDOWN_WINDOWS, phase)
    two = Stack(root, "ranks", STRAGGLER_WINDOWS, phase)
    try:
        one.boot()
        two.boot()
        one.daemon.wait_ready()
        two.daemon.wait_ready()
        first, second = one.launch(SLOWDOWN_PHASE), two.launch(RANKS_PHASE)
        wait_for(lambda: _hung(one.daemon), 90, "the stalled run's hang page")
        stalled = first.pop("stall")
        stalled.kill()  # a stall never ends by itself: a canary runner kills it, as here
        phase.codes["stall"] = stalled.proc.returncode if stalled.proc is not None else 0
        one.finish(first)
        two.finish(second)
        assert terminate_together(one.daemon, two.daemon) == [0, 0]  # both drain and commit: what follows is final
        one.read()
        two.read()
        yield phase
    finally:
        one.stop()
        two.stop()


def _group(pgid: int) -> list[int]:
    """The processes of group ``pgid``, the newest (a launcher's ranks) first."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat_fields(int(proc.name))[2]) == pgid:  # state, ppid, pgrp
                pids.append(int(proc.name))
    return sorted(pids, reverse=True)


def _stacks(log: str, frames: int = 4) -> str:
    """The fault handlers' dumps in ``log``, each thread cut to its innermost ``frames`` lines."""
    kept: list[str] = []
    left = 0
    for line in log.splitlines():
        if line.startswith("Fatal Python error"):
            kept.append(line)
        elif line.startswith(("Thread 0x", "Current thread 0x")):
            kept.append(line)
            left = frames
        elif line.startswith("  ") and left:
            kept.append(line)
            left -= 1
        else:
            left = 0
    return "\n".join(kept)


def _log(canary: Canary) -> str:
    return canary.log.read_text(errors="replace")[-3000:]


def _report(phase: Phase, run_id: str, kind: str) -> None:
    """The fault's detection, printed for ``pytest -s``: step, latency in steps and seconds."""
    fault = next(e for e in phase.events.get(run_id, []) if e["fault"] == kind and e["kind"] == "fault_injected")
    first = next(a for a in phase.anomalies.get(run_id, []) if a["detector"] == EXPECTED[kind])
    steps = "" if first["step"] is None else f", {first['step'] - fault['step']} steps"
    print(
        f"canary {kind}: injected at step {fault['step']}, {first['detector']} {first['severity']} at step "
        f"{first['step']} ({first['t'] - fault['t']:.1f} s{steps}); run {phase.canaries[run_id].wall:.1f} s"
    )


@pytest.mark.timeout(100)  # the first pays its module's canary runs: ~30 s
@pytest.mark.xdist_group("canary_steps_phase")  # with --dist loadgroup: one worker runs the phase, not each
@pytest.mark.parametrize("run_id", ["clean-supervised", "clean-rl"])
def test_a_clean_workload_runs_to_the_end_and_raises_nothing(steps_phase: Phase, run_id: str) -> None:
    canary = steps_phase.canaries[run_id]
    assert steps_phase.codes[run_id] == 0, _log(canary)
    assert steps_phase.anomalies.get(run_id, []) == []
    assert steps_phase.events.get(run_id, []) == []


@pytest.mark.timeout(120)  # the first pays its module's timed canary runs: ~37 s
@pytest.mark.serial  # judged on real processes' step times, which a loaded machine skews (a false straggler)
@pytest.mark.xdist_group("canary_time_phase")
def test_a_clean_two_rank_run_raises_nothing_with_the_straggler_judging_short_windows(time_phase: Phase) -> None:
    assert time_phase.codes["clean-two_rank"] == 0, _log(time_phase.canaries["clean-two_rank"])
    anomalies = time_phase.anomalies.get("clean-two_rank", [])
    assert anomalies == [], [(a["detector"], a["rank"], a["step"], a["severity"], a["message"]) for a in anomalies]
    assert time_phase.events.get("clean-two_rank", []) == []


def _caught(phase: Phase, run_id: str, kinds: list[str]) -> None:
    """Each fault injected once, caught by its detector at or after the injection; no other detector pages."""
    injected = {e["fault"]: e for e in phase.events.get(run_id, []) if e["kind"] == "fault_injected"}
    assert sorted(injected) == sorted(kinds), phase.events.get(run_id)
    assert not [e for e in phase.events.get(run_id, []) if e["kind"] == "fault_missed"]
    anomalies = phase.anomalies.get(run_id, [])
    for kind in kinds:
        fault, detector = injected[kind], EXPECTED[kind]
        first = next((a for a in anomalies if a["detector"] == detector), None)
        assert first is not None, f"{detector} missed {kind}: {anomalies}\n{_log(phase.canaries[run_id])}"
        assert first["t"] >= fault["t"], f"{detector} opened before the fault: {first}, {fault}"
        if first["step"] is not None and detector != "hang":  # hang names the last step made: K - 1
            assert first["step"] >= fault["step"], (first, fault)
        _report(phase, run_id, kind)
    others = {(a["detector"], a["message"][:160]) for a in anomalies if a["severity"] == "page"}
    assert {d for d, _ in others} <= {EXPECTED[k] for k in kinds}, others


@pytest.mark.xdist_group("canary_steps_phase")
@pytest.mark.parametrize(
    "run_id", ["nan_grad", "grad_spike+ckpt_corrupt", "lr_spike", "gil", "kl_explode", "reward_hack"]
)
def test_a_fault_judged_by_steps_is_caught_by_its_detector_and_nothing_else_pages(
    steps_phase: Phase, run_id: str
) -> None:
    assert steps_phase.codes[run_id] == 0, _log(steps_phase.canaries[run_id])
    _caught(steps_phase, run_id, run_id.split("+"))


@pytest.mark.serial  # judged on real processes' step times, which a loaded machine skews (a false straggler)
@pytest.mark.xdist_group("canary_time_phase")
def test_a_slowdown_is_caught_by_slowdown_over_its_own_earlier_windows(time_phase: Phase) -> None:
    assert time_phase.codes["slowdown"] == 0, _log(time_phase.canaries["slowdown"])
    _caught(time_phase, "slowdown", ["slowdown"])


@pytest.mark.serial  # judged on real processes' step times, which a loaded machine skews (a false straggler)
@pytest.mark.xdist_group("canary_time_phase")
def test_a_stall_leaves_a_live_process_that_hang_pages(time_phase: Phase) -> None:
    assert time_phase.codes["stall"] == -9, "alive until killed"
    _caught(time_phase, "stall", ["stall"])


@pytest.mark.serial  # judged on real processes' step times, which a loaded machine skews (a false straggler)
@pytest.mark.xdist_group("canary_time_phase")
def test_a_straggler_is_the_last_rank_only_and_straggler_names_it(time_phase: Phase) -> None:
    assert time_phase.codes["straggler"] == 0, _log(time_phase.canaries["straggler"])
    _caught(time_phase, "straggler", ["straggler"])
    assert {e["rank"] for e in time_phase.events["straggler"]} == {1}
    assert {a["rank"] for a in time_phase.anomalies["straggler"] if a["detector"] == "straggler"} == {1}


# ---- the table and the workload-only kinds ----------------------------------------------------


def test_the_table_names_runnable_modules_and_every_training_fault_on_supervised() -> None:
    assert sorted(WORKLOADS) == ["rl", "supervised", "two_rank"]
    for name, w in WORKLOADS.items():
        assert w.name == name and w.module == f"trainvigil.canary.{name}"
        assert importlib.util.find_spec(w.module) is not None
        assert set(w.faults) <= set(EXPECTED) and 0 < w.fault_step < w.steps
    assert set(WORKLOADS["supervised"].faults) == set(faults.KINDS)
    assert {k for w in WORKLOADS.values() for k in w.faults} == set(EXPECTED)


@pytest.fixture
def accepting() -> Iterator[None]:
    yield
    faults.accept()  # the process-wide setting back to refusing them


def test_a_workload_only_kind_parses_once_accepted_and_is_refused_again_after(accepting: None) -> None:
    with pytest.raises(ConfigError, match="'kl_explode' needs a canary workload"):
        faults.parse("kl_explode@5")
    faults.accept("kl_explode", "reward_hack")
    assert faults.parse("kl_explode@5,nan_grad@7") == (faults.Fault("kl_explode", 5), faults.Fault("nan_grad", 7))
    with pytest.raises(ConfigError, match="'straggler' needs a canary workload") as info:
        faults.parse("straggler@5")
    valid = "nan_grad, grad_spike, lr_spike, slowdown, stall, ckpt_corrupt, gil, kl_explode, reward_hack"
    assert f"valid kinds: {valid};" in str(info.value)
    with pytest.raises(ValueError, match="not workload-only fault kinds: nan_grad"):
        faults.accept("nan_grad")
    faults.accept()
    with pytest.raises(ConfigError, match="'reward_hack' needs a canary workload"):
        faults.parse("reward_hack@5")


@pytest.mark.parametrize(("workload", "fault"), [("supervised", "kl_explode@5"), ("two_rank", "reward_hack@5")])
def test_a_kind_its_workload_does_not_apply_stops_it_with_one_line(workload: str, fault: str) -> None:
    env = {**os.environ, faults.ENV: fault, "VIGIL_NATS_URL": "nats://127.0.0.1:1", "VIGIL_RUN_ID": "refused"}
    proc = subprocess.run(
        [sys.executable, "-m", WORKLOADS[workload].module, "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    kind = fault.split("@")[0]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"trainvigil.errors.ConfigError: VIGIL_FAULT='{fault}': '{kind}' needs a canary workload")
