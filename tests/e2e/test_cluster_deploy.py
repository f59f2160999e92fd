"""deploy/cluster/ (compose and Kubernetes) agrees with itself, with the CLI, and runs as written.

No Docker engine or Kubernetes here: the compose file is validated against the vendored compose-spec
schema, the manifests are cross-checked field by field, and the compose file's ``auth`` and three
``nats`` commands are run with the real CLI and nats-server (paths and hosts mapped to loopback), so
the cluster flags, the users and the account's shard mappings are known to start a JetStream cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import nats
import pytest
import yaml
from support import wait_for

from trainvigil.daemon import config as config_mod
from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open
from trainvigil.daemon.cli.main import build_parser
from trainvigil.schemas.credentials import BusAccess
from trainvigil.schemas.shards import parse_shard, shard_of

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "cluster"
SPEC = Path(__file__).resolve().parents[1] / "data" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    """Every manifest by (kind, name)."""
    found = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path.name}: {doc}"
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _shards(compose: dict[str, Any]) -> dict[str, list[str]]:
    return {name: svc["command"] for name, svc in compose["services"].items() if name.startswith("shard-")}


def _nodes(compose: dict[str, Any]) -> dict[str, list[str]]:
    return {name: svc["command"] for name, svc in compose["services"].items() if name.startswith("nats-")}


# ---- compose ------------------------------------------------------------------------------------------


def test_the_cluster_compose_file_is_valid_against_the_compose_spec(compose: dict[str, Any]) -> None:
    validator = jsonschema.Draft7Validator(json.loads(SPEC.read_text()))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors


def test_every_shard_command_is_a_valid_vigil_up_and_together_they_cover_the_mapped_count(
    compose: dict[str, Any],
) -> None:
    auth = compose["services"]["auth"]["command"]
    count = int(_flag(auth, "--shards"))
    seen = []
    for name, command in _shards(compose).items():
        args = build_parser().parse_args(command)  # exits (failing the test) on an unknown flag
        assert args.command == "up"
        env = compose["services"][name]["environment"]
        cfg = config_mod.load(None, {"nats_url": args.nats_url, "shard": args.shard}, env=env)
        shard = cfg.shard_id
        assert shard is not None and shard.count == count, f"{name}: {args.shard} against --shards {count}"
        assert cfg.stream.replicas == 3 <= len(_nodes(compose))
        seen.append(shard.index)
        assert name == f"shard-{shard.index}"
    assert sorted(seen) == list(range(count))


def test_shards_know_every_nats_node_and_every_node_routes_to_the_others(compose: dict[str, Any]) -> None:
    nodes = _nodes(compose)
    for command in _shards(compose).values():
        hosts = {urlsplit(u).hostname for u in config_mod.nats_servers(_flag(command, "--nats"))}
        assert hosts == set(nodes)
    for name, command in nodes.items():
        routes = {urlsplit(u).hostname for u in _flag(command, "--routes").split(",")}
        assert routes == set(nodes) - {name}
        assert _flag(command, "--cluster_name") == "vigil"


def test_every_named_volume_is_declared_and_each_shard_and_node_has_its_own(compose: dict[str, Any]) -> None:
    mounts = {
        name: [v.split(":")[0] for v in svc.get("volumes", []) if not v.startswith((".", "/"))]
        for name, svc in compose["services"].items()
    }
    assert {v for vs in mounts.values() for v in vs} == set(compose["volumes"])
    data = [vs[0] for name, vs in mounts.items() if name.startswith(("nats-", "shard-"))]
    assert len(data) == len(set(data)), "two nodes or shards share a data volume"


def _node_argv(
    command: list[str], *, auth: Path, store: Path, client: int, monitor: int, routes: dict[str, int]
) -> list[str]:
    """A compose nats command on loopback: the auth volume and store mapped to directories, hosts to ports."""
    argv = [str(find_binary())]
    for arg in command:
        arg = arg.replace("/etc/nats/auth", str(auth))
        arg = "nats://127.0.0.1:" + str(routes["self"]) if arg == "nats://0.0.0.0:6222" else arg
        arg = re.sub(r"nats://(nats-\d+):6222", lambda m: f"nats://127.0.0.1:{routes[m.group(1)]}", arg)
        argv.append(arg)
    argv[argv.index("-sd") + 1] = str(store)
    argv[argv.index("-m") + 1] = str(monitor)
    return [*argv, "-a", "127.0.0.1", "-p", str(client)]


@pytest.fixture
def compose_cluster(compose: dict[str, Any], tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """The compose file's auth job, then its three nats commands as real processes."""
    auth_dir = tmp_path / "bus-auth"
    auth = [arg.replace("/data", str(auth_dir)) for arg in compose["services"]["auth"]["command"]]
    subprocess.run([sys.executable, "-m", "trainvigil.daemon.cli", *auth], check=True, capture_output=True)
    nodes = _nodes(compose)
    route_ports = {name: free_port() for name in nodes}
    client_ports = {name: free_port() for name in nodes}
    processes = []
    try:
        for name, command in nodes.items():
            argv = _node_argv(
                command,
                auth=auth_dir,
                store=tmp_path / name,
                client=client_ports[name],
                monitor=free_port(),
                routes={**route_ports, "self": route_ports[name]},
            )
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps its own descriptor
            with log:
                processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        urls = [f"nats://127.0.0.1:{p}" for p in client_ports.values()]
        for port in client_ports.values():
            wait_for(partial(port_open, "127.0.0.1", port), 15, "a nats node to listen")
        yield urls, auth_dir
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


def test_the_compose_auth_and_nats_commands_start_a_jetstream_cluster_that_partitions_runs(
    compose: dict[str, Any], compose_cluster: tuple[list[str], Path]
) -> None:
    urls, auth_dir = compose_cluster
    count = int(_flag(compose["services"]["auth"]["command"], "--shards"))

    async def ready() -> bool:
        access = BusAccess(creds=str(auth_dir / "daemon.toml"))
        nc = await nats.connect(urls, connect_timeout=1, allow_reconnect=False, **access.connect_options())
        try:
            await nc.jetstream().account_info()
            got = []

            async def mapped(msg: Any) -> None:
                got.append(msg.subject)

            await nc.subscribe("vigil.v1.*.*.probe", cb=mapped)
            await nc.publish("vigil.v1.some-run.probe", b"")
            await nc.flush()
            await asyncio.sleep(0.1)
            return got == [f"vigil.v1.{shard_of('some-run', count)}.some-run.probe"]
        finally:
            await nc.close()

    def asked() -> bool:
        try:
            return asyncio.run(asyncio.wait_for(ready(), 5))
        except (OSError, TimeoutError, nats.errors.Error):
            return False

    wait_for(asked, 60, "the compose cluster's JetStream and the account's shard mappings")


# ---- kubernetes ---------------------------------------------------------------------------------------


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def test_each_statefulset_selects_its_pods_through_a_headless_service(k8s: dict[tuple[str, str], Any]) -> None:
    for (kind, name), sts in k8s.items():
        if kind != "StatefulSet":
            continue
        labels = sts["spec"]["template"]["metadata"]["labels"]
        selector = sts["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), name
        service = k8s[("Service", sts["spec"]["serviceName"])]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= labels.items()


def test_nats_pods_route_to_every_pod_of_the_statefulset(k8s: dict[tuple[str, str], Any]) -> None:
    sts = k8s[("StatefulSet", "nats")]
    args = _container(sts)["args"]
    pods = {f"nats-{i}.nats" for i in range(sts["spec"]["replicas"])}
    assert {urlsplit(u).hostname for u in _flag(args, "--routes").split(",")} == pods
    assert "-js" in args and _flag(args, "-sd") in {m["mountPath"] for m in _container(sts)["volumeMounts"]}


def test_each_shard_pod_runs_vigil_up_with_its_ordinal_as_its_shard(k8s: dict[tuple[str, str], Any]) -> None:
    sts = k8s[("StatefulSet", "vigil-shard")]
    container = _container(sts)
    env = _env(container)
    replicas = sts["spec"]["replicas"]
    assert int(env["SHARDS"]) == replicas
    nats_pods = {f"nats-{i}.nats" for i in range(k8s[("StatefulSet", "nats")]["spec"]["replicas"])}
    assert {urlsplit(u).hostname for u in config_mod.nats_servers(env["VIGIL_NATS_URL"])} == nats_pods
    shell, dash_c, script = container["command"]
    assert (shell, dash_c) == ("sh", "-c") and script.startswith("exec vigil ")
    for ordinal in range(replicas):
        # The shell's own expansion of the pod's hostname: the argv vigil would get.
        printed = subprocess.run(
            ["sh", "-c", script.replace("exec vigil ", "printf '%s\\n' ", 1)],
            env={**os.environ, "HOSTNAME": f"vigil-shard-{ordinal}", "SHARDS": env["SHARDS"]},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        args = build_parser().parse_args(printed)
        assert parse_shard(args.shard).index == ordinal and parse_shard(args.shard).count == replicas
        cfg = config_mod.load(None, {"shard": args.shard}, env=env)
        assert cfg.stream.replicas == 3 and cfg.shard_id is not None


def test_agents_get_the_same_cluster_and_their_own_credentials(k8s: dict[tuple[str, str], Any]) -> None:
    agent = k8s[("ConfigMap", "vigil-agent")]["data"]
    shard_env = _env(_container(k8s[("StatefulSet", "vigil-shard")]))
    assert agent["VIGIL_NATS_URL"] == shard_env["VIGIL_NATS_URL"]
    assert agent["VIGIL_NATS_CREDS"].endswith("/agent.toml")
    job = k8s[("Job", "example-training")]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in job["containers"][0]["volumeMounts"]}
    assert agent["VIGIL_NATS_CREDS"].startswith(mounts["vigil"])
    assert {v["name"]: v["secret"]["secretName"] for v in job["volumes"]} == {"vigil": "vigil-agent"}


def test_every_secret_the_manifests_mount_is_one_the_instructions_create(k8s: dict[tuple[str, str], Any]) -> None:
    created = set(re.findall(r"kubectl create secret generic (\S+)", (DEPLOY / "k8s" / "nats.yaml").read_text()))
    mounted = {
        v["secret"]["secretName"]
        for doc in k8s.values()
        for v in (doc.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []))
        if "secret" in v
    }
    assert mounted <= created and {"vigil-nats", "vigil-daemon", "vigil-agent"} <= mounted
