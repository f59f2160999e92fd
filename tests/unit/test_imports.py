"""``import trainvigil`` stays light: what a training script pays for importing it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import trainvigil
import trainvigil.agents.agent

ROOT = Path(__file__).resolve().parents[2]


def test_import_trainvigil_leaves_the_broker_client_for_the_agents_thread() -> None:
    """nats-py (with aiohttp) takes ~120 ms to import: a training script that imports trainvigil, or runs
    with the agent disabled, never loads it; a started agent's thread does, at its first connect."""
    code = (
        "import sys, trainvigil\n"
        "assert 'nats' not in sys.modules, 'imported with trainvigil'\n"
        "agent = trainvigil.init(run_id='imports', enabled=False)\n"
        "agent.log(0, loss=1.0)\n"
        "agent.close()\n"
        "assert 'nats' not in sys.modules, 'imported by a disabled agent'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _installed_closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` pull in, transitively (as installed here; extras of theirs left out)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (req.marker and not req.marker.evaluate({"extra": ""})) or name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.requires(req.name) or []]
    return seen


def _daemon_only_modules() -> list[str]:
    """The top-level modules of what ``pip install 'trainvigil[daemon]'`` adds to the agent's install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = _installed_closure(project["optional-dependencies"]["daemon"]) - _installed_closure(project["dependencies"])
    assert {"stamina", "tenacity", "duckdb", "anyio", "structlog"} <= extra, extra
    return sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if extra & {canonicalize_name(d) for d in dists}
    )


def test_the_agent_imports_nothing_only_the_daemon_extra_installs() -> None:
    """The base install is the agent's: with every module the ``daemon`` extra brings (stamina and tenacity under
    it, DuckDB, anyio, structlog...) made unimportable, ``trainvigil``'s public names, the agent's worker and
    transport (nats-py as well: the worker's first connect imports it) load, and a disabled agent logs."""
    blocked = _daemon_only_modules()
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None  # import raises ImportError, as where it is not installed\n"
        "import trainvigil, trainvigil.agents.transport.worker, trainvigil.agents.transport.publisher\n"
        "import trainvigil.agents.spill.push, nats\n"
        "for package in (trainvigil, trainvigil.agents):\n"
        "    for name in package.__all__:\n"
        "        getattr(package, name)\n"
        "agent = trainvigil.init(run_id='imports', enabled=False)\n"
        "agent.log(0, loss=1.0)\n"
        "agent.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_importing_the_daemons_app_loads_no_agent() -> None:
    """Every ``trainvigil.*`` import runs ``trainvigil/__init__.py``: its public names are lazy, so ``vigil up``
    loads none of the agent (worker, transport, GIL sampler), nor torch, matplotlib, the canary workloads or the
    CLI above it."""
    code = "import sys, trainvigil.daemon.app\nprint('\\n'.join(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "trainvigil.daemon.app" in loaded
    unwanted = ["trainvigil.agents", "trainvigil.canary", "trainvigil.optim", "trainvigil.daemon.cli"]
    unwanted += ["torch", "jax", "matplotlib"]
    leaked = [m for m in loaded if any(m == u or m.startswith(f"{u}.") for u in unwanted)]
    assert not leaked, f"trainvigil.daemon.app loaded {leaked}"


def test_every_public_name_resolves() -> None:
    """Each name of ``__all__`` (loaded on first use) is there and listed by ``dir()``; the submodules scripts
    reach as attributes load on first use; an unknown name is an AttributeError naming it."""
    for package in (trainvigil, trainvigil.agents):
        for name in package.__all__:
            assert getattr(package, name) is not None, name
            assert name in dir(package), name
    assert trainvigil.init is trainvigil.agents.agent.init
    assert trainvigil.Agent is trainvigil.agents.Agent
    assert trainvigil.agents.AgentOptions.__module__ == "trainvigil.agents.options"
    assert trainvigil.schemas.__name__ == "trainvigil.schemas"
    for package in (trainvigil, trainvigil.agents):
        with pytest.raises(AttributeError, match="no_such_name"):
            _ = package.no_such_name
