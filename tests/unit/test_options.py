"""The agent's options (``agents/options.py``): arguments, overrides and environment in order; bad values named."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trainvigil.agents.options import DEFAULT_NATS_URL, AgentOptions, resolve
from trainvigil.errors import ConfigError


def test_resolve_reads_torchrun_rank_env_and_vigil_settings(tmp_path: Path) -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "VIGIL_RUN_ID": "my-run",
        "VIGIL_NATS_URL": "nats://broker:4222",
        "VIGIL_FLUSH_INTERVAL": "0.5",
        "VIGIL_BATCH_SIZE": "100",
        "VIGIL_SPILL_DIR": str(tmp_path),
    }
    opts, generated = resolve(None, None, None, {}, env)
    assert (opts.rank, opts.world_size, opts.local_rank) == (5, 8, 1)
    assert opts.run_id == "my-run"
    assert not generated
    assert opts.nats_url == "nats://broker:4222"
    assert opts.flush_interval == 0.5
    assert opts.batch_size == 100
    assert opts.spill_dir == tmp_path
    assert opts.enabled


def test_resolve_defaults_without_env() -> None:
    opts, generated = resolve(None, None, None, {}, {})
    assert (opts.rank, opts.world_size, opts.local_rank) == (0, 1, 0)
    assert opts.nats_url == DEFAULT_NATS_URL
    assert generated
    assert opts.run_id


def test_resolve_arguments_beat_env_and_overrides_beat_env() -> None:
    env = {"RANK": "5", "VIGIL_RUN_ID": "env-run", "VIGIL_NATS_URL": "nats://env:1", "VIGIL_BATCH_SIZE": "10"}
    opts, generated = resolve("arg-run", 2, "nats://arg:2", {"batch_size": 20}, env)
    assert (opts.run_id, opts.rank, opts.nats_url, opts.batch_size) == ("arg-run", 2, "nats://arg:2", 20)
    assert not generated


def test_resolve_unknown_option_raises_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="flush_intervall") as info:
        resolve("r", None, None, {"flush_intervall": 1.0}, {})
    assert info.value.key == "flush_intervall"


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_resolve_bad_int_env_raises_config_error_naming_the_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        resolve("r", None, None, {}, {name: "two"})
    assert info.value.key == name


def test_resolve_bad_float_env_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="VIGIL_FLUSH_INTERVAL") as info:
        resolve("r", None, None, {}, {"VIGIL_FLUSH_INTERVAL": "fast"})
    assert info.value.key == "VIGIL_FLUSH_INTERVAL"


def test_resolve_bad_override_type_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="max_buffer"):
        resolve("r", None, None, {"max_buffer": "lots"}, {})


@pytest.mark.parametrize(("name", "value"), [("flush_interval", 0), ("batch_size", 0), ("close_timeout", -1)])
def test_options_reject_non_positive_settings(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=name):
        overrides: dict[str, Any] = {name: value}
        AgentOptions(run_id="r", **overrides)


def test_options_reject_empty_run_id() -> None:
    with pytest.raises(ConfigError, match="run_id"):
        AgentOptions(run_id="")


def test_resolve_uses_torchelastic_run_id_when_world_size_above_one() -> None:
    opts, generated = resolve(None, None, None, {}, {"WORLD_SIZE": "4", "RANK": "3", "TORCHELASTIC_RUN_ID": "abc"})
    assert opts.run_id == "torchrun-abc"
    assert not generated


def test_resolve_vigil_run_id_beats_torchelastic_run_id() -> None:
    opts, _ = resolve(None, None, None, {}, {"WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "abc", "VIGIL_RUN_ID": "v"})
    assert opts.run_id == "v"


def test_resolve_multi_rank_without_torchelastic_shares_a_launcher_based_run_id() -> None:
    opts, generated = resolve(None, None, None, {}, {"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"})
    assert opts.run_id.endswith(f"-{os.getppid()}")
    assert not generated


def test_resolve_vigil_disabled_turns_the_agent_off() -> None:
    opts, _ = resolve("r", None, None, {}, {"VIGIL_DISABLED": "1"})
    assert not opts.enabled


def test_gil_options_from_arguments_and_environment() -> None:
    opts, _ = resolve("r", None, None, {}, env={"VIGIL_GIL": "1", "VIGIL_GIL_INTERVAL": "0.5"})
    assert opts.gil is True and opts.gil_interval == 0.5
    assert resolve("r", None, None, {"gil": False}, env={"VIGIL_GIL": "1"})[0].gil is False
    assert resolve("r", None, None, {}, env={})[0].gil is False
    with pytest.raises(ConfigError, match="gil_interval"):
        resolve("r", None, None, {"gil_interval": 0}, env={})
