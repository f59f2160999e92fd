"""``ckpt_mismatch``: replicas that disagree, and checkpoints that changed between save and load.

Replica parity: with ``watch(..., parity_every=N)`` every rank of a data-parallel run
publishes a digest of its parameters at the same steps. Once all ``world_size`` ranks
reported a step (or ``wait_rounds`` later parity steps arrived from two or more ranks without
the missing ones), the ranks whose root differs from the majority's are paged, one episode per odd
rank. With no strict majority (two replicas, or a tie) the lowest rank present is the
reference: DDP broadcasts rank 0's weights at start, so it is the one the others copy.

Save/load: a ``load`` digest of a path whose ``save`` digest is known and differs, or any
load the agent itself found corrupt (``ok`` false), pages the loading rank. Loads are
positioned by their time in milliseconds (they have no step order of their own), so a
later clean load clears the episode.

Memory is bounded: at most ``max_pending_steps`` parity steps per run wait for ranks
(the oldest are judged with what they have), a run's parity state goes once it ends or
goes idle, and ``max_paths`` save digests are kept (least recently saved forgotten first).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import ClassVar

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Episodes, Finding
from trainvigil.daemon.detectors._series import StreamKey
from trainvigil.daemon.detectors._settings import CkptMismatchSettings
from trainvigil.schemas import Anomaly, CheckpointDigest, Source


@dataclass(frozen=True, slots=True)
class _Seen:
    root: str
    algo: str
    tensors: dict[str, str]
    time: float


def _differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))


class CkptMismatch:
    name: ClassVar[str] = "ckpt_mismatch"
    Settings: ClassVar[type[DetectorSettings]] = CkptMismatchSettings
    coalesce: ClassVar[bool] = False

    def __init__(self, settings: CkptMismatchSettings) -> None:
        self.settings = settings
        self.episodes = Episodes(self.name, settings.cooldown)
        self.load_episodes = Episodes(self.name, 1)
        self._parity: dict[str, dict[int, dict[int, _Seen]]] = {}
        self._world: dict[str, int] = {}
        self._judged: dict[str, int] = {}
        self._saved: OrderedDict[str, _Seen] = OrderedDict()
        """Save digests by path, shared by every run (a resumed run loads what an earlier one saved):
        bounded by ``max_paths``, never forgotten with a run, not counted in :meth:`tracked`."""

    def forget(self, key: StreamKey) -> None:
        # Parity is judged across the ranks of a run: a rank that ended first may still be named
        # by digests of the others that arrive later, so its parity episode lives until the run goes.
        self.load_episodes.forget(key)

    def forget_run(self, run_id: str) -> None:
        self._parity.pop(run_id, None)
        self._world.pop(run_id, None)
        self._judged.pop(run_id, None)
        self.episodes.forget_run(run_id)

    def tracked(self) -> int:
        return len(self._parity) + len(self._world) + len(self._judged) + len(self.episodes) + len(self.load_episodes)

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        out: list[Anomaly] = []
        touched: set[str] = set()
        for source, rec in batch.checkpoints:
            seen = _Seen(rec.root, rec.algo, rec.tensors, rec.time)
            if rec.origin == "parity" and rec.step is not None:
                if rec.step > self._judged.get(source.run_id, -(2**63)):
                    self._parity.setdefault(source.run_id, {}).setdefault(rec.step, {})[source.rank] = seen
                    self._world[source.run_id] = max(self._world.get(source.run_id, 1), source.world_size)
                    touched.add(source.run_id)
            elif rec.origin == "save" and rec.path:
                self._saved[rec.path] = seen
                self._saved.move_to_end(rec.path)
                while len(self._saved) > self.settings.max_paths:
                    self._saved.popitem(last=False)
            elif rec.origin == "load":
                out.extend(self._judge_load(source, rec, batch.now))
        for run_id in sorted(touched):
            out.extend(self._judge_parity(run_id, batch.now))
        return out

    # ---- replica parity -----------------------------------------------------------------

    def _judge_parity(self, run_id: str, now: float | None) -> list[Anomaly]:
        pending = self._parity[run_id]
        world = self._world[run_id]
        steps = sorted(pending)
        # Later steps that two or more ranks reported: the run moved on without the missing ranks. One
        # rank's own later steps are no such sign (an agent that reached the broker late delivers its
        # whole run at once, before the other rank's digests come).
        shared_after = [0] * len(steps)
        count = 0
        for i in range(len(steps) - 1, -1, -1):
            shared_after[i] = count
            count += len(pending[steps[i]]) >= 2
        out: list[Anomaly] = []
        for i, step in enumerate(steps):
            later = shared_after[i]
            overflow = len(pending) > self.settings.max_pending_steps
            if len(pending[step]) < world and later < self.settings.wait_rounds and not overflow:
                continue
            ranks = pending.pop(step)
            self._judged[run_id] = max(self._judged.get(run_id, step), step)
            out.extend(self._judge_step(run_id, step, ranks, now))
        return out

    def _judge_step(self, run_id: str, step: int, ranks: dict[int, _Seen], now: float | None) -> list[Anomaly]:
        if len(ranks) < 2:
            return []
        counts = Counter(s.root for s in ranks.values())
        top, n = counts.most_common(1)[0]
        majority = n * 2 > len(ranks)
        reference_rank = min(r for r, s in ranks.items() if s.root == top) if majority else min(ranks)
        reference = ranks[reference_rank]
        out: list[Anomaly] = []
        for rank in sorted(ranks):
            seen = ranks[rank]
            key = (run_id, rank)
            time = now if now is not None else seen.time
            if seen.root == reference.root:
                out.extend(self.episodes.quiet(key, step, time))
                continue
            names = _differing(reference.tensors, seen.tensors)
            shown = ", ".join(names[: self.settings.max_named]) + (
                " ..." if len(names) > self.settings.max_named else ""
            )
            how = (
                f"{n} of {len(ranks)} ranks agree"
                if majority
                else f"no majority among {len(ranks)} ranks; rank {reference_rank} is the reference"
            )
            message = (
                f"rank {rank}'s parameters differ from the other replicas at step {step} ({how}); "
                f"{len(names)} tensors differ: {shown or 'unknown'}. Silent divergence or memory corruption on "
                f"rank {rank}'s host/device: stop the run, check that host, "
                "resume all ranks from the last good checkpoint"
            )
            out.extend(
                self.episodes.flag(key, step, PAGE, time, Finding(float(len(names)), None, None, message), step=step)
            )
        return out

    # ---- save vs load -------------------------------------------------------------------

    def _judge_load(self, source: Source, rec: CheckpointDigest, now: float | None) -> list[Anomaly]:
        key = (source.run_id, source.rank)
        at = int(rec.time * 1000)
        time = now if now is not None else rec.time
        saved = self._saved.get(rec.path)
        comparable = saved is not None and saved.algo == rec.algo
        if rec.ok and not (comparable and saved is not None and saved.root != rec.root):
            return self.load_episodes.quiet(key, at, time)
        names = _differing(saved.tensors, rec.tensors) if comparable and saved is not None else []
        shown = ", ".join(names[: self.settings.max_named]) + (" ..." if len(names) > self.settings.max_named else "")
        against = "its save-time digest" if comparable else "its manifest"
        message = (
            f"checkpoint {rec.path} loaded by rank {source.rank} does not match {against}"
            f"{f' ({len(names)} tensors differ: {shown})' if names else ''}: the file was corrupted or replaced "
            "after saving; restore it from another copy or an earlier checkpoint before training on it"
        )
        finding = Finding(float(len(names)) if names else None, None, None, message)
        return self.load_episodes.flag(key, at, PAGE, time, finding, step=rec.step)
