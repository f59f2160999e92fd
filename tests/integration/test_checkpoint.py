"""Checkpoint digests, manifests, verification on load, ``vigil verify`` and background digests."""

from __future__ import annotations

import json
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import NatsServer, vigil, wait_for

from trainvigil import checkpoint
from trainvigil.agents import digest as digest_mod
from trainvigil.agents.checkpoint import digest_later
from trainvigil.errors import CheckpointIntegrityError, ManifestMissingError

if TYPE_CHECKING:  # torch is imported where it is used: collecting this module stays light
    import torch


def _state() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "note": "hello"}


def test_digest_is_deterministic_and_independent_of_dict_order() -> None:
    import torch

    a = OrderedDict([("x", torch.arange(6.0)), ("y", {"b": torch.ones(2), "a": 1.5})])
    b = OrderedDict([("y", {"a": 1.5, "b": torch.ones(2)}), ("x", torch.arange(6.0))])
    da, db = checkpoint.digest(a), checkpoint.digest(b)
    assert da.root == db.root
    assert list(da.entries) == ["x", "y.a", "y.b"]
    assert checkpoint.digest(a, threads=1) == da, "one thread and many give the same digest"


@pytest.mark.parametrize("change", ["dtype", "shape", "name", "bytes"])
def test_digest_covers_name_dtype_shape_and_bytes(change: str) -> None:
    import torch

    other = {
        "dtype": {"w": torch.arange(6.0).to(torch.float64)},
        "shape": {"w": torch.arange(6.0).reshape(2, 3)},
        "name": {"v": torch.arange(6.0)},
        "bytes": {"w": torch.arange(6.0) + torch.tensor([0, 0, 0, 1e-6, 0, 0])},  # one value
    }[change]
    base = checkpoint.digest({"w": torch.arange(6.0)})
    assert checkpoint.digest(other).root != base.root


def test_digest_of_optimizer_state_names_every_leaf_and_sha256_differs_from_blake3() -> None:
    state = _state()
    d = checkpoint.digest(state)
    assert {"optim.state.0.exp_avg", "optim.state.1.exp_avg_sq", "optim.param_groups.0.lr", "epoch"} <= set(d.entries)
    s = checkpoint.digest(state, algo="sha256")
    assert s.algo == "sha256" and set(s.entries) == set(d.entries) and s.root != d.root
    assert all(len(h) == 64 for h in s.entries.values())
    with pytest.raises(ValueError, match="unknown digest algorithm"):
        checkpoint.digest(state, algo="md5")


def test_non_contiguous_bfloat16_and_empty_tensors_hash_by_content() -> None:
    import torch

    t = torch.randn(4, 6).to(torch.bfloat16)
    assert checkpoint.digest({"t": t.t()}).root == checkpoint.digest({"t": t.t().contiguous()}).root
    assert checkpoint.digest({"e": torch.empty(0, 3)}).root != checkpoint.digest({"e": torch.empty(3, 0)}).root


def test_big_tensors_hashed_with_several_blake3_threads_match_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    state = {"big": torch.randn(300_000), "small": torch.randn(10)}
    single = checkpoint.digest(state, threads=1)
    monkeypatch.setattr(digest_mod, "BIG_TENSOR_BYTES", 1024)
    assert checkpoint.digest(state, threads=4) == single


def _flip_byte_in_tensor(path: Path, record_suffix: str, offset: int) -> None:
    """Flip one bit inside a tensor's stored bytes (zip entries are stored uncompressed)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(record_suffix))
    data = bytearray(path.read_bytes())
    start = info.header_offset
    name_len, extra_len = struct.unpack("<HH", data[start + 26 : start + 30])
    data[start + 30 + name_len + extra_len + offset] ^= 0x01
    path.write_bytes(bytes(data))


def _storage_record(path: Path, tensor: torch.Tensor) -> str:
    """The zip record holding ``tensor``'s storage, found by its bytes."""
    want = tensor.contiguous().numpy().tobytes()
    with zipfile.ZipFile(path) as z:
        return next(i.filename for i in z.infolist() if "/data/" in i.filename and z.read(i) == want)


@pytest.fixture
def no_history(nats_server: NatsServer, tmp_path: Path) -> list[str]:
    """Where ``vigil verify`` asks who saved a file: a broker no daemon listens on (its no-responders answer
    comes at once, where a closed port costs the client seconds of retries) and a data directory with no
    history, never a daemon a developer runs on the default port."""
    return ["--nats", nats_server.url, "--data-dir", str(tmp_path / "no-history")]


def test_flipped_byte_fails_load_and_vigil_verify_names_the_tensor(tmp_path: Path, no_history: list[str]) -> None:
    import torch

    path = tmp_path / "ckpt.pt"
    state: dict[str, Any] = {"encoder.weight": torch.randn(64, 64), "decoder.weight": torch.randn(64, 64), "step": 7}
    saved = checkpoint.save(state, path, step=7)
    manifest = json.loads(checkpoint.manifest_path(path).read_text())
    assert manifest["root"] == saved.root and manifest["step"] == 7
    assert set(manifest["entries"]) == {"encoder.weight", "decoder.weight", "step"}

    ok = vigil("verify", str(path), *no_history)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    loaded = checkpoint.load(path)
    assert torch.equal(loaded["encoder.weight"], state["encoder.weight"])

    _flip_byte_in_tensor(path, _storage_record(path, state["decoder.weight"]), 1234)
    bad = vigil("verify", str(path), *no_history)
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    assert "decoder.weight" in bad.stdout and "encoder.weight" not in bad.stdout
    with pytest.raises(CheckpointIntegrityError) as err:
        checkpoint.load(path)
    assert err.value.differing == ["decoder.weight"]
    assert "decoder.weight" in str(err.value)
    assert checkpoint.load(path, verify=False)["step"] == 7, "verify=False is plain torch.load"


def test_missing_manifest_exits_2_and_raises(tmp_path: Path, no_history: list[str]) -> None:
    import torch

    path = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(3)}, path)
    result = vigil("verify", str(path), *no_history)
    assert result.returncode == 2, result.stderr
    assert "no manifest" in result.stderr
    with pytest.raises(ManifestMissingError):
        checkpoint.load(path)


def test_unreadable_checkpoint_exits_1(tmp_path: Path, no_history: list[str]) -> None:
    import torch

    path = tmp_path / "trunc.pt"
    checkpoint.save({"w": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:200])
    result = vigil("verify", str(path), *no_history)
    assert result.returncode == 1 and "cannot be read" in result.stderr, result.stderr


def test_background_digest_with_snapshot_describes_the_state_at_call_time() -> None:
    import torch

    state = {"w": torch.randn(1000, 100), "b": torch.zeros(10)}
    before = checkpoint.digest(state)
    future = digest_later(state, snapshot=True)
    state["w"].add_(1.0)  # training goes on right away
    state["b"][0] = 5.0
    assert future.result(timeout=30) == before


def test_background_digest_without_snapshot_refuses_a_tensor_changed_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    import torch

    from trainvigil.agents import checkpoint as ckpt_mod

    gate = threading.Event()
    real = ckpt_mod.digest

    def gated(*args: Any, **kwargs: Any) -> Any:
        gate.wait(30)  # hold the hash until the test has changed the tensor
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt_mod, "digest", gated)
    w = torch.zeros(10)
    future = digest_later({"w": w}, snapshot=False)
    w.add_(1.0)
    gate.set()
    with pytest.raises(CheckpointIntegrityError) as err:
        future.result(timeout=30)
    assert err.value.differing == ["w"]
    calm = digest_later({"w": torch.ones(10)}, snapshot=False)
    assert calm.result(timeout=30) == checkpoint.digest({"w": torch.ones(10)})


def test_checkpoint_saved_returns_a_future_and_close_waits_for_it() -> None:
    import torch

    import trainvigil

    agent = trainvigil.init(run_id="ckpt-unit", enabled=False)
    state = {"w": torch.randn(256, 256)}
    future = agent.checkpoint_saved("/tmp/x.pt", state, step=3)
    wait_for(future.done, 30, "the background digest")
    assert future.result() == checkpoint.digest(state)
    assert agent.close(timeout=5)
