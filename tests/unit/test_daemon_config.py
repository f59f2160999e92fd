"""The daemon's settings (``daemon/config.py``): defaults, file, environment and flags in order; bad keys named."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainvigil.daemon.config import DaemonConfig, StreamConfig, load
from trainvigil.errors import ConfigError


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vigil.toml"
    path.write_text(text)
    return path


def test_config_defaults_without_file_env_or_flags() -> None:
    config = load(env={})
    assert config == DaemonConfig()
    assert config.stream == StreamConfig()
    assert config.db_path == Path("vigil-data") / "vigil.duckdb"


def test_config_precedence_defaults_then_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'data_dir = "from-file"\nhttp_port = 1111\nfetch_batch = 10\nlog_level = "debug"\n')
    env = {"VIGIL_HTTP_PORT": "2222", "VIGIL_FETCH_BATCH": "20"}
    config = load(path, overrides={"fetch_batch": 30, "query_row_limit": None}, env=env)
    assert config.data_dir == "from-file"  # file beats default
    assert config.log_level == "debug"
    assert config.http_port == 2222  # env beats file
    assert config.fetch_batch == 30  # flag beats env
    assert config.query_row_limit == DaemonConfig().query_row_limit  # a None flag is ignored
    assert config.http_host == "127.0.0.1"  # untouched default


def test_config_empty_env_value_is_ignored(tmp_path: Path) -> None:
    path = _toml(tmp_path, "http_port = 1111\n")
    assert load(path, env={"VIGIL_HTTP_PORT": ""}).http_port == 1111


def test_config_nested_stream_table_from_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[stream]\nname = "TEST"\nmax_age_s = 3600\nmax_bytes = 1024\n')
    config = load(path, env={})
    assert config.stream.name == "TEST"
    assert config.stream.max_age_s == 3600.0
    assert config.stream.max_bytes == 1024
    assert config.stream.consumer == "vigil-daemon"


def test_config_stream_keys_from_env_and_dotted_overrides(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[stream]\nname = "FILE"\nmax_age_s = 3600\n')
    env = {"VIGIL_STREAM_MAX_AGE_S": "600.5", "VIGIL_STREAM_NAME": "ENV"}
    config = load(path, overrides={"stream.name": "FLAG"}, env=env)
    assert config.stream.max_age_s == 600.5
    assert config.stream.name == "FLAG"


def test_config_unknown_top_level_key_raises_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http_prot"):
        load(_toml(tmp_path, "http_prot = 1\n"), env={})


def test_config_unknown_stream_key_raises_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_agee"):
        load(_toml(tmp_path, "[stream]\nmax_agee = 1\n"), env={})


def test_config_unknown_override_key_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        load(overrides={"bogus": 1}, env={})


def test_config_bad_type_in_file_raises_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http_port"):
        load(_toml(tmp_path, 'http_port = "ninety"\n'), env={})


def test_config_bad_type_in_env_raises_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="max_age_s"):
        load(env={"VIGIL_STREAM_MAX_AGE_S": "a week"})


def test_config_bad_literal_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="log_format"):
        load(overrides={"log_format": "xml"}, env={})


def test_config_missing_file_raises_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load(missing, env={})
    assert info.value.key == "config"
    assert str(missing) in str(info.value)


def test_config_invalid_toml_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load(_toml(tmp_path, "http_port = = 3\n"), env={})
    assert info.value.key == "config"
