"""compose.yaml, the Dockerfile and deploy/prometheus.yml agree with each other and with the CLI.

No Docker engine is needed: compose.yaml is validated against the compose-spec JSON Schema
(vendored verbatim from compose-spec/compose-spec, schema/compose-spec.json, as
tests/data/compose-spec.json) and cross-checked field by field.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = Path(__file__).resolve().parent / "data" / "compose-spec.json"


def _load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_yaml(ROOT / "compose.yaml")


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SPEC.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    pairs = []
    for line in logical.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            pairs.append((instruction.upper(), args.strip()))
    return pairs


def _docker_exec_form(instruction: str) -> list[str]:
    found = [json.loads(args) for name, args in _dockerfile() if name == instruction]
    assert len(found) == 1, f"expected one {instruction} in the Dockerfile, found {len(found)}"
    return found[0]


def _flags(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs of a command line."""
    flags = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            assert i + 1 < len(argv) and not argv[i + 1].startswith("--"), f"{arg} has no value in {argv}"
            flags[arg] = argv[i + 1]
    return flags


def _container_ports(service: dict[str, Any]) -> set[int]:
    # Short syntax only ("HOST:CONTAINER" or "CONTAINER"), which is what compose.yaml uses.
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}


def _volume_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    mounts = []
    for entry in service.get("volumes", []):
        source, target, *_ = str(entry).split(":")
        mounts.append((source, target))
    return mounts


def _is_named(source: str) -> bool:
    return not source.startswith((".", "/", "~", "$"))


def test_compose_file_is_valid_against_the_compose_spec(
    compose: dict[str, Any], validator: jsonschema.Draft7Validator
) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


def test_the_vendored_schema_rejects_an_unknown_service_key(
    compose: dict[str, Any], validator: jsonschema.Draft7Validator
) -> None:
    """Guards the check above: a schema that accepted anything would make it pass vacuously."""
    broken = copy.deepcopy(compose)
    broken["services"]["daemon"]["comand"] = broken["services"]["daemon"].pop("command")
    assert not validator.is_valid(broken)


def test_services_are_nats_daemon_and_prometheus(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"nats", "daemon", "prometheus"}
    assert services["daemon"]["build"] == "."
    assert "nats" in services["daemon"]["depends_on"]


def test_daemon_command_equals_the_dockerfile_cmd(compose: dict[str, Any]) -> None:
    assert _docker_exec_form("ENTRYPOINT") == ["vigil"]
    assert compose["services"]["daemon"]["command"] == _docker_exec_form("CMD")


def test_daemon_command_is_accepted_by_the_cli_parser(compose: dict[str, Any]) -> None:
    cli = pytest.importorskip("trainvigil.daemon.cli")
    command = compose["services"]["daemon"]["command"]
    assert command[0] == "up"
    # argparse exits (SystemExit, failing the test) on an unknown flag or a bad value.
    parsed = vars(cli.build_parser().parse_args(command))
    values = {str(v) for v in parsed.values()}
    missing = set(_flags(command).values()) - values
    assert not missing, f"flag values the parser did not keep: {missing} (parsed: {parsed})"


def test_daemon_http_port_agrees_everywhere(compose: dict[str, Any]) -> None:
    """The --http-port flag, the published port, the healthcheck URL and EXPOSE name one port."""
    daemon = compose["services"]["daemon"]
    flags = _flags(daemon["command"])
    port = int(flags["--http-port"])
    assert flags["--http-host"] == "0.0.0.0", "the daemon must listen beyond the container's loopback"
    assert _container_ports(daemon) == {port}
    check = " ".join(daemon["healthcheck"]["test"])
    assert f"http://localhost:{port}/healthz" in check
    assert "urllib" in check
    assert [args for name, args in _dockerfile() if name == "EXPOSE"] == [str(port)]


def test_daemon_nats_url_names_the_nats_service(compose: dict[str, Any]) -> None:
    url = urlsplit(_flags(compose["services"]["daemon"]["command"])["--nats"])
    assert url.scheme == "nats"
    assert url.hostname in compose["services"]
    assert url.port in _container_ports(compose["services"][url.hostname])


def test_jetstream_and_daemon_data_live_on_named_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    nats_command = services["nats"]["command"]
    assert "-js" in nats_command
    store_dir = nats_command[nats_command.index("-sd") + 1]
    assert (store_dir, True) in {(target, _is_named(source)) for source, target in _volume_mounts(services["nats"])}
    data_dir = _flags(services["daemon"]["command"])["--data-dir"]
    assert (data_dir, True) in {(target, _is_named(source)) for source, target in _volume_mounts(services["daemon"])}
    assert ("VOLUME", data_dir) in _dockerfile()


def test_every_named_volume_is_declared_and_every_declared_one_used(compose: dict[str, Any]) -> None:
    used = {source for svc in compose["services"].values() for source, _ in _volume_mounts(svc) if _is_named(source)}
    assert used, "expected named volumes for nats, daemon and prometheus data"
    assert used == set(compose.get("volumes") or {})


def test_bind_mounted_files_exist(compose: dict[str, Any]) -> None:
    binds = [
        source for svc in compose["services"].values() for source, _ in _volume_mounts(svc) if not _is_named(source)
    ]
    assert binds, "expected deploy/prometheus.yml to be bind-mounted"
    for source in binds:
        assert (ROOT / source).is_file(), f"{source} is mounted but does not exist"


def test_prometheus_scrapes_the_daemon_metrics_endpoint(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    assert ("./deploy/prometheus.yml", "/etc/prometheus/prometheus.yml") in _volume_mounts(prometheus)
    config = _load_yaml(ROOT / "deploy" / "prometheus.yml")
    port = _flags(compose["services"]["daemon"]["command"])["--http-port"]
    jobs = [
        job
        for job in config["scrape_configs"]
        if any(f"daemon:{port}" in static.get("targets", []) for static in job.get("static_configs", []))
    ]
    assert len(jobs) == 1, "exactly one scrape job should target the daemon service"
    assert jobs[0].get("metrics_path", "/metrics") == "/metrics"
    assert jobs[0].get("scrape_interval", config.get("global", {}).get("scrape_interval")) == "5s"
