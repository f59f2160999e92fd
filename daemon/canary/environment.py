"""The environment a canary job runs in: this daemon's broker and namespace, an agent's credentials, its run id
and fault.

A job is an ordinary training process, so it gets what any agent gets and nothing of the
daemon's own: the daemon's ``VIGIL_NATS_CREDS`` (which may do anything on the bus) is never
passed on; with auth on, the job gets the *agent* credentials file. Its ``VIGIL_NAMESPACE`` is always
the daemon's ``namespace`` (none in the default one), whatever the daemon's environment or the job's
``env`` table say: a canary that reported to another namespace would never be seen by its judge.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from trainvigil.daemon.broker.auth import credentials_file
from trainvigil.daemon.broker.bus import auth_dir, embedded_auth
from trainvigil.daemon.config import DaemonConfig

log = structlog.get_logger("trainvigil.canary")

_NOT_PASSED_ON = (
    "VIGIL_NATS_CREDS",
    "VIGIL_NATS_TLS_CA",
    "VIGIL_FAULT",
    "VIGIL_RUN_ID",
    "VIGIL_DISABLED",
    "VIGIL_NAMESPACE",
)
"""The daemon's own values of these are not the job's (``RANK`` and friends are torchrun's, see below)."""
_LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def agent_creds(config: DaemonConfig) -> str:
    """The agent credentials file canaries connect with: ``canary.agent_creds``, else the bundled
    broker's ``DATA_DIR/bus/agent.toml`` when it has auth, else none (an open broker)."""
    if config.canary.agent_creds:
        return str(Path(config.canary.agent_creds).resolve())
    local = credentials_file(auth_dir(config), "agent")
    if not config.nats_url and embedded_auth(config) and local.exists():
        return str(local.resolve())
    if config.nats_creds:
        log.warning(
            "canary_without_credentials",
            note="the daemon connects with credentials but canary.agent_creds is empty: canaries connect without; "
            "set canary.agent_creds (VIGIL_CANARY_AGENT_CREDS) to the agent credentials file",
        )
    return ""


def base_env(config: DaemonConfig, nats_url: str, inherited: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What every canary job of this daemon gets: the daemon's environment less its bus secrets and
    launcher variables, plus this broker's URL and the daemon's namespace, the agent's credentials and TLS
    trust, and a spill directory under ``DATA_DIR/canary`` unless one is set."""
    env = {k: v for k, v in inherited.items() if k not in _NOT_PASSED_ON and k not in _LAUNCHER}
    env["VIGIL_NATS_URL"] = nats_url
    if config.namespace:
        env["VIGIL_NAMESPACE"] = config.namespace
    if creds := agent_creds(config):
        env["VIGIL_NATS_CREDS"] = creds
    if config.nats_tls_ca:
        env["VIGIL_NATS_TLS_CA"] = str(Path(config.nats_tls_ca).resolve())
    env.setdefault("VIGIL_SPILL_DIR", str((Path(config.data_dir) / "canary" / "spill").resolve()))
    return env


def job_env(base: Mapping[str, str], run_id: str, fault: str, extra: Mapping[str, str]) -> dict[str, str]:
    """One job's environment: ``base``, the job's own ``env`` table, its run id and ``VIGIL_FAULT`` (none: clean);
    ``VIGIL_NAMESPACE`` stays ``base``'s (the daemon's), whatever the table says."""
    env = {k: v for k, v in {**base, **extra, "VIGIL_RUN_ID": run_id}.items() if k != "VIGIL_NAMESPACE"}
    if namespace := base.get("VIGIL_NAMESPACE"):
        env["VIGIL_NAMESPACE"] = namespace
    if fault:
        env["VIGIL_FAULT"] = fault
    return env
