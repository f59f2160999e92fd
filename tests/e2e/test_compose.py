"""compose.yaml, compose.dev.yaml, the Dockerfile and deploy/prometheus.yml agree with each other and with the CLI.

No Docker engine is needed: the compose files are validated against the compose-spec JSON Schema
(vendored verbatim from compose-spec/compose-spec, schema/compose-spec.json, as
tests/data/compose-spec.json) and cross-checked field by field; the ``auth`` and ``nats``
commands are run as written, with the real CLI and nats-server, volumes mapped to directories.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import nats
import pytest
import yaml
from support import wait_for

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path(__file__).resolve().parents[1] / "data" / "compose-spec.json"


def _load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_yaml(ROOT / "compose.yaml")


@pytest.fixture(scope="module")
def dev(compose: dict[str, Any]) -> dict[str, Any]:
    """compose.yaml with compose.dev.yaml over it, merged as compose does for these keys (lists appended)."""
    merged = copy.deepcopy(compose)
    for name, service in _load_yaml(ROOT / "compose.dev.yaml")["services"].items():
        for key, value in service.items():
            base = merged["services"][name].get(key)
            merged["services"][name][key] = base + value if isinstance(base, list) else value
    return merged


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


@pytest.mark.parametrize("which", ["compose.yaml", "compose.dev.yaml", "merged"])
def test_compose_files_are_valid_against_the_compose_spec(
    which: str, dev: dict[str, Any], validator: jsonschema.Draft7Validator
) -> None:
    document = dev if which == "merged" else _load_yaml(ROOT / which)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == []


def test_the_vendored_schema_rejects_an_unknown_service_key(
    compose: dict[str, Any], validator: jsonschema.Draft7Validator
) -> None:
    """Guards the check above: a schema that accepted anything would make it pass vacuously."""
    broken = copy.deepcopy(compose)
    broken["services"]["daemon"]["comand"] = broken["services"]["daemon"].pop("command")
    assert not validator.is_valid(broken)


def test_services_are_auth_nats_daemon_prometheus_and_grafana(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"auth", "nats", "daemon", "prometheus", "grafana"}
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


def test_daemon_http_port_agrees_everywhere(compose: dict[str, Any], dev: dict[str, Any]) -> None:
    """The --http-port flag, the port published for development, the healthcheck URL and EXPOSE name one port."""
    daemon = compose["services"]["daemon"]
    flags = _flags(daemon["command"])
    port = int(flags["--http-port"])
    assert flags["--http-host"] == "0.0.0.0", "the daemon must listen beyond the container's loopback"
    assert "ports" not in daemon, "the daemon's HTTP endpoint is for Prometheus, on the internal network"
    assert _container_ports(dev["services"]["daemon"]) == {port}
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


def _published(service: dict[str, Any]) -> list[tuple[str, int]]:
    """(host address, container port) of each published port; "" is every interface."""
    found = []
    for entry in service.get("ports", []):
        parts = str(entry).split(":")
        found.append((parts[0] if len(parts) == 3 else "", int(parts[-1].split("/")[0])))
    return found


@pytest.mark.parametrize("which", ["compose.yaml", "merged"])
def test_only_the_bus_port_is_published_beyond_loopback(
    which: str, compose: dict[str, Any], dev: dict[str, Any]
) -> None:
    services = (dev if which == "merged" else compose)["services"]
    open_ports = {
        (name, port) for name, svc in services.items() for host, port in _published(svc) if host != "127.0.0.1"
    }
    assert open_ports == {("nats", 4222)}


def test_the_http_endpoint_is_on_an_internal_network_with_prometheus_only(compose: dict[str, Any]) -> None:
    internal = {name for name, net in compose["networks"].items() if (net or {}).get("internal")}
    on = {name: set(svc.get("networks", [])) for name, svc in compose["services"].items()}
    assert len(internal) == 1
    assert {name for name, nets in on.items() if nets & internal} == {"daemon", "prometheus"}
    assert not on["nats"] & internal
    assert compose["services"]["auth"]["network_mode"] == "none"


def _mount_of(service: dict[str, Any], path: str) -> tuple[str, str, bool]:
    """(volume, the path inside it, read-only) of the mount holding ``path`` in ``service``."""
    for entry in service.get("volumes", []):
        source, target, *mode = str(entry).split(":")
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source, path[len(target) :].lstrip("/"), mode == ["ro"]
    raise AssertionError(f"nothing is mounted at {path} in {service}")


def test_credentials_come_from_the_auth_volume_read_only_and_never_from_the_file(compose: dict[str, Any]) -> None:
    services = compose["services"]
    cli = pytest.importorskip("trainvigil.daemon.cli")
    auth = services["auth"]["command"]
    assert vars(cli.build_parser().parse_args(auth))["command"] == "auth"
    volume, _, read_only = _mount_of(services["auth"], auth[1])
    assert not read_only
    nats_config = services["nats"]["command"][services["nats"]["command"].index("-c") + 1]
    assert _mount_of(services["nats"], nats_config) == (volume, "nats-server.conf", True)
    assert services["nats"]["depends_on"]["auth"]["condition"] == "service_completed_successfully"
    creds = services["daemon"]["environment"]["VIGIL_NATS_CREDS"]
    assert _mount_of(services["daemon"], creds) == (volume, "daemon.toml", True)
    settings = json.dumps(compose).lower()  # comments aside: no secret, nor a flag that would carry one
    assert "password" not in settings and "--creds" not in settings


@pytest.fixture
def compose_bus(compose: dict[str, Any], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """compose.yaml's ``auth`` then ``nats`` commands, run as written with each volume a directory of tmp_path;
    only nats-server's address and ports are chosen here. Yields its URL and the daemon's credentials file."""
    from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open
    from trainvigil.daemon.cli import main

    services = compose["services"]

    def on_host(service: str, path: str) -> str:
        volume, inside, _ = _mount_of(services[service], path)
        return str(tmp_path / volume / inside)

    auth = services["auth"]["command"]
    assert main([auth[0], on_host("auth", auth[1])]) == 0
    argv = list(services["nats"]["command"])
    argv[argv.index("-c") + 1] = on_host("nats", argv[argv.index("-c") + 1])
    argv[argv.index("-sd") + 1] = on_host("nats", argv[argv.index("-sd") + 1])
    argv[argv.index("-m") + 1] = str(free_port())
    port = free_port()
    server = subprocess.Popen([str(find_binary()), *argv, "-a", "127.0.0.1", "-p", str(port)], stderr=subprocess.PIPE)
    try:
        wait_for(lambda: port_open("127.0.0.1", port), 10, "the compose nats command to listen")
        yield f"nats://127.0.0.1:{port}", Path(on_host("daemon", services["daemon"]["environment"]["VIGIL_NATS_CREDS"]))
    finally:
        server.terminate()
        server.communicate(timeout=10)


def test_the_compose_bus_refuses_strangers_and_lets_each_role_do_its_job(compose_bus: tuple[str, Path]) -> None:
    from nats.aio.client import Client as NATS

    from trainvigil.daemon.broker.jetstream import ensure_stream
    from trainvigil.daemon.config import StreamConfig
    from trainvigil.schemas.credentials import BusAccess

    url, daemon_creds = compose_bus

    async def connect(role: str | None) -> NATS:
        nc = NATS()
        creds = str(daemon_creds.with_name(f"{role}.toml")) if role else ""
        try:
            await nc.connect(url, allow_reconnect=False, error_cb=_ignore, **BusAccess(creds=creds).connect_options())
        except Exception:
            await nc.close()
            raise
        return nc

    async def main() -> tuple[int, bool]:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await connect(None)
        daemon, agent, reader = [await connect(role) for role in ("daemon", "agent", "reader")]
        try:
            await ensure_stream(daemon.jetstream(), StreamConfig())
            ack = await agent.jetstream().publish("vigil.v1.run.metrics", b"x")
            try:
                await reader.jetstream().publish("vigil.v1.run.metrics", b"forged", timeout=0.5)
                forged = True
            except nats.errors.TimeoutError:
                forged = False
            return ack.seq, forged
        finally:
            for nc in (daemon, agent, reader):
                await nc.close()

    assert asyncio.run(main()) == (1, False)


async def _ignore(exc: Exception) -> None:
    """nats-py logs every refusal; here they are the point."""


def test_bind_mounted_files_exist(compose: dict[str, Any]) -> None:
    binds = [
        source for svc in compose["services"].values() for source, _ in _volume_mounts(svc) if not _is_named(source)
    ]
    assert binds, "expected deploy/prometheus.yml to be bind-mounted"
    for source in binds:
        assert (ROOT / source).exists(), f"{source} is mounted but does not exist"


def test_grafana_is_provisioned_with_the_dashboards_and_prometheus(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = dict(_volume_mounts(grafana))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = _load_yaml(ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "trainvigil.yml")
    assert mounts["./deploy/grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    source = _load_yaml(ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (datasource,) = source["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and set(grafana["networks"]) & set(
        compose["services"]["prometheus"]["networks"]
    )
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]


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
