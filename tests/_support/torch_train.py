"""A watched torch training process for the end-to-end tests.

Usage: torch_train.py single RUN_ID CKPT_DIR     one process: watch + loss rows, save/load a checkpoint
       torch_train.py ddp RUN_ID PERTURB_STEP     one rank of a 2-process gloo DDP run (RANK, WORLD_SIZE,
                                                  MASTER_ADDR/PORT from the environment); rank 1 perturbs
                                                  its weights before the optimizer step PERTURB_STEP
Exit code 0 only if close() reports every event delivered.
"""

from __future__ import annotations

import gc
import sys
import zipfile
from pathlib import Path

import torch

import trainvigil
from trainvigil import checkpoint
from trainvigil.errors import CheckpointIntegrityError
from trainvigil.torch import watch

gc.freeze()  # the imports' objects are never garbage: no collection walks them (the last one, at exit, ~0.7 CPU-s)

STEPS = 30
PARITY_EVERY = 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def _corrupt(path: Path) -> None:
    """Flip one bit in the first tensor record of a torch.save zip (stored uncompressed)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    name_len = int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    data[info.header_offset + 30 + name_len + extra_len + 5] ^= 0x10
    path.write_bytes(bytes(data))


def single(run_id: str, ckpt_dir: Path) -> int:
    agent = trainvigil.init(run_id=run_id, flush_interval=0.05)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watch(model, opt)  # the current agent
    for step in range(STEPS):
        opt.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        agent.log(step, loss=loss.detach())  # before the step: the row merges with watch()'s later
        loss.backward()
        opt.step()
    path = ckpt_dir / "model.pt"
    checkpoint.save(model.state_dict(), path, step=STEPS)
    agent.checkpoint_saved(str(ckpt_dir / "other.pt"), model.state_dict(), step=STEPS).result(timeout=60)
    _corrupt(path)
    try:
        checkpoint.load(path)
        print("a corrupt checkpoint loaded without error", file=sys.stderr)
        return 1
    except CheckpointIntegrityError as exc:
        print(f"refused as expected: {exc}", file=sys.stderr)
    return 0 if agent.close(timeout=60) else 1


def ddp(run_id: str, perturb_step: int) -> int:
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = watch(model, opt, parity_every=PARITY_EVERY)  # agent from torch.distributed's rank and world size
    agent = w.agent
    torch.manual_seed(100 + rank)  # each rank its own data shard
    for step in range(STEPS):
        opt.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        if rank == 1 and step == perturb_step:
            with torch.no_grad():
                model.module[0].weight[0, 0] += 1e-3  # silent corruption on one replica only
        opt.step()
        agent.log(step, loss=loss.detach())
    torch.distributed.barrier()
    ok = agent.close(timeout=60)
    torch.distributed.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    mode, run = sys.argv[1], sys.argv[2]
    sys.exit(single(run, Path(sys.argv[3])) if mode == "single" else ddp(run, int(sys.argv[3])))
