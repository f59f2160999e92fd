"""The daemon's settings (``daemon/config.py``): defaults, file, environment and flags in order; bad keys named."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import msgspec
import pytest

from trainvigil.daemon.config import (
    AlertsConfig,
    CanaryConfig,
    CanaryJob,
    DaemonConfig,
    StoreConfig,
    StreamConfig,
    load,
)
from trainvigil.errors import ConfigError
from trainvigil.schemas.settings import convert, field_type_at


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


_DAY, _BYTES, _COUNT = "86400", "1125899906842624", "2147483647"


@pytest.mark.parametrize(
    ("key", "value", "rule", "shown"),
    [
        ("stream.replicas", "7", "an integer from 1 to 5", "7"),
        ("stream.name", "a.b", "a name without spaces, '.', '*', '>', '/'", "'a.b'"),
        ("stream.consumer", "my daemon", "a name without spaces, '.', '*', '>', '/'", "'my daemon'"),
        ("stream.max_age_s", "-1", "a number >= 0 and <= 315360000", "-1.0"),
        ("stream.duplicate_window_s", "0", f"a number > 0 and <= {_DAY}", "0.0"),
        ("stream.ack_wait_s", "1e300", f"a number > 0 and <= {_DAY}", "1e+300"),
        ("store.min_free_bytes", "-1", f"a number >= 0 and <= {_BYTES}", "-1"),
        ("alerts.timeout_s", "0", f"a number > 0 and <= {_DAY}", "0.0"),
        ("alerts.retries", "-1", f"a number >= 0 and <= {_COUNT}", "-1"),
        ("alerts.backoff_s", "-1", f"a number >= 0 and <= {_DAY}", "-1.0"),
        ("alerts.drain_s", "nan", f"a number >= 0 and <= {_DAY}", "nan"),
        ("alerts.queue_size", "0", f"a number >= 1 and <= {_COUNT}", "0"),
        ("canary.fault_probability", "1.5", "a number from 0 to 1", "1.5"),
        ("canary.concurrency", "0", f"a number >= 1 and <= {_COUNT}", "0"),
        ("canary.timeout_s", "inf", f"a number > 0 and <= {_DAY}", "inf"),
        ("canary.settle_s", "-1", f"a number >= 0 and <= {_DAY}", "-1.0"),
        ("canary.linger_s", "90000", f"a number >= 0 and <= {_DAY}", "90000.0"),
        ("canary.nice", "20", "a niceness from 0 to 19", "20"),
        ("canary.keep_logs", "0", f"a number >= 1 and <= {_COUNT}", "0"),
        ("data_dir", " ", "a directory path", "' '"),
        ("embedded_port", "0", "a port number 1-65535", "0"),
        ("embedded_host", " ", "a host name or address", "' '"),
        ("http_host", " ", "a host name or address", "' '"),
        ("http_port", "65536", "a port number 0-65535", "65536"),
        ("fetch_batch", "0", f"a number >= 1 and <= {_COUNT}", "0"),
        ("fetch_max_bytes", str(2**51), f"a number >= 1 and <= {_BYTES}", str(2**51)),
        ("fetch_timeout_s", "0", f"a number > 0 and <= {_DAY}", "0.0"),
        ("connect_timeout_s", "-5", f"a number > 0 and <= {_DAY}", "-5.0"),
        ("query_row_limit", "0", f"a number >= 1 and <= {_COUNT}", "0"),
        ("query_timeout_s", "86401", f"a number > 0 and <= {_DAY}", "86401.0"),
        ("query_rate_per_s", "10001", "a number > 0 and <= 10000", "10001.0"),
        ("query_burst", "100001", "a number >= 1 and <= 100000", "100001"),
        ("query_askers_max", "0", "a number >= 1 and <= 100000", "0"),
    ],
)
def test_a_value_past_its_limit_is_a_config_error_naming_key_variable_rule_and_value(
    key: str, value: str, rule: str, shown: str
) -> None:
    """Whether from the environment or a flag, the message is ``KEY (VARIABLE) must be RULE, not VALUE``."""
    variable = "VIGIL_" + key.replace(".", "_").upper()
    said = f"{key} ({variable}) must be {rule}, not {shown}"
    with pytest.raises(ConfigError) as info:
        load(env={variable: value})
    assert said in str(info.value) and info.value.key == key
    with pytest.raises(ConfigError) as info:
        load(overrides={key: msgspec.convert(value, _base_type(key), strict=False)}, env={})
    assert said in str(info.value) and info.value.key == key


def _base_type(key: str) -> type:
    struct: Any = DaemonConfig
    *tables, name = key.split(".")
    for table in tables:
        struct = {f.name: f.type for f in msgspec.structs.fields(struct)}[table]
    field_type = {f.name: f.type for f in msgspec.structs.fields(struct)}[name]
    return get_args(field_type)[0] if get_origin(field_type) is Annotated else field_type


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (lambda: StreamConfig(replicas=0), "stream.replicas (VIGIL_STREAM_REPLICAS) must be an integer from 1 to 5"),
        (lambda: StoreConfig(min_free_bytes=-1), "store.min_free_bytes (VIGIL_STORE_MIN_FREE_BYTES) must be"),
        (lambda: AlertsConfig(queue_size=0), "alerts.queue_size (VIGIL_ALERTS_QUEUE_SIZE) must be a number >= 1"),
        (lambda: CanaryConfig(nice=-1), "canary.nice (VIGIL_CANARY_NICE) must be a niceness from 0 to 19, not -1"),
        (lambda: CanaryJob(name="a b", command="x"), "canary.jobs.name (VIGIL_CANARY_JOBS_NAME) must be a name of"),
        (lambda: CanaryJob(name="a", command=" "), "canary.jobs.command (VIGIL_CANARY_JOBS_COMMAND) must be a command"),
        (lambda: CanaryJob(name="a", command="x", fault_step=-1), "canary.jobs.fault_step (VIGIL_CANARY_JOBS_FAULT"),
        (lambda: DaemonConfig(http_port=-1), "http_port (VIGIL_HTTP_PORT) must be a port number 0-65535, not -1"),
        (lambda: DaemonConfig(query_timeout_s=0.0), "query_timeout_s (VIGIL_QUERY_TIMEOUT_S) must be a number > 0"),
    ],
)
def test_keyword_construction_checks_the_same_limits(build: Callable[[], object], said: str) -> None:
    """A config built in code (tests, an embedding program) is held to the limits a loaded one is."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        build()


@pytest.mark.parametrize(
    ("env", "key", "said"),
    [
        (
            {"VIGIL_STREAM_MAX_AGE_S": "60", "VIGIL_STREAM_DUPLICATE_WINDOW_S": "120"},
            "stream.duplicate_window_s",
            "stream.duplicate_window_s (VIGIL_STREAM_DUPLICATE_WINDOW_S) must be <= stream.max_age_s, not 120.0",
        ),
        (
            {"VIGIL_ALERTS_BACKOFF_S": "10", "VIGIL_ALERTS_BACKOFF_MAX_S": "5"},
            "alerts.backoff_max_s",
            "alerts.backoff_max_s (VIGIL_ALERTS_BACKOFF_MAX_S) must be a number >= alerts.backoff_s, not 5.0",
        ),
        (
            {"VIGIL_EMBEDDED_TLS_CERT": "cert.pem"},
            "embedded_tls_key",
            "embedded_tls_key (VIGIL_EMBEDDED_TLS_KEY) must be given together with embedded_tls_cert, not ''",
        ),
        ({"VIGIL_SHARD": "0/2"}, "shard", "shard (VIGIL_SHARD) must be given with nats_url (--nats)"),
        ({"VIGIL_SHARD": "2/2", "VIGIL_NATS_URL": "nats://h:1"}, "shard", "shard (VIGIL_SHARD) must be INDEX/COUNT"),
        ({"VIGIL_STREAM_MAX_BYTES": "0"}, "stream.max_bytes", "must be a number >= 1 and <= 1125899906842624, or -1"),
        ({"VIGIL_STREAM_MAX_MSGS_PER_SUBJECT": "0"}, "stream.max_msgs_per_subject", "or -1, not 0"),
        ({"VIGIL_STORE_MEMORY_LIMIT_BYTES": "5"}, "store.memory_limit_bytes", "must be a number >= 33554432"),
        ({"VIGIL_CANARY_EVERY": "0s"}, "canary.every", "canary.every (VIGIL_CANARY_EVERY) must be an interval > 0"),
    ],
)
def test_a_rule_across_settings_or_values_is_a_config_error_naming_its_key(
    env: dict[str, str], key: str, said: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(env=env)
    assert said in str(info.value) and info.value.key == key


def test_a_bad_value_in_a_list_of_tables_says_which_item() -> None:
    jobs = [{"name": "ok", "command": "x"}, {"name": "not ok", "command": "x"}]
    with pytest.raises(ConfigError) as info:
        load(overrides={"canary.jobs": jobs}, env={})
    assert "canary.jobs.name (VIGIL_CANARY_JOBS_NAME) must be a name of letters, digits, _ and -" in str(info.value)
    assert "$.canary.jobs[1]" in str(info.value) and info.value.key == "canary.jobs.name"


def test_a_wrong_type_still_says_what_msgspec_expected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Expected `int`, got `str` - at `\$.http_port`") as info:
        load(_toml(tmp_path, 'http_port = "ninety"\n'), env={})
    assert info.value.key == "http_port"


def test_every_registered_detector_has_its_table_in_the_settings_in_order() -> None:
    """The light settings module and the detectors' registry name the same detectors with the same settings."""
    from trainvigil.daemon import detectors

    names = {d.name for d in detectors.REGISTRY}
    tables = [(f.name, f.type) for f in msgspec.structs.fields(detectors.DetectorsConfig) if f.name in names]
    assert tables == [(d.name, d.Settings) for d in detectors.REGISTRY]


@pytest.mark.parametrize(
    ("tree", "hint"),
    [
        ({"stream": {"max_agee_s": 1}}, "did you mean 'max_age_s'?"),
        ({"canary": {"jobs": [{"name": "a", "command": "x", "fault_stp": 1}]}}, "did you mean 'fault_step'?"),
    ],
    ids=["a table", "an item of a list of tables"],
)
def test_a_mistyped_key_inside_a_table_is_told_the_closest_key_of_that_table(tree: dict[str, Any], hint: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=re.escape(hint)):
        convert(tree, DaemonConfig)


def test_the_field_at_an_error_path_keeps_its_meta_and_a_path_off_the_structs_is_none() -> None:
    name = field_type_at(DaemonConfig, "$.canary.jobs[1].name")
    assert get_origin(name) is Annotated and get_args(name)[0] is str
    assert any(isinstance(m, msgspec.Meta) and m.description for m in get_args(name)[1:])
    assert field_type_at(DaemonConfig, "$.stream.nope") is None
    assert field_type_at(DaemonConfig, "$.data_dir.deeper") is None
