"""``vigil sql`` starts fast: what it imports to ask a daemon loads none of the daemon's own work."""

from __future__ import annotations

import subprocess
import sys

HEAVY = [
    "numpy",
    "structlog",
    "duckdb",
    "pyarrow",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "stamina",
    "trainvigil.daemon.detectors._base",
    "trainvigil.daemon.metrics",
]
"""What only the daemon (its detectors, store, web side, metrics, logs) or a fallback (the data directory's file,
a busy daemon's retries) needs: ``vigil sql`` answered by a daemon loads none of it."""

_ASK_A_DAEMON = """\
import sys
from trainvigil.daemon.cli.main import build_parser
from trainvigil.daemon.cli import _answer, _config, cmd_sql, sqlclient
from trainvigil.daemon import config, formatting
from trainvigil.daemon.broker import bus, holders

args = build_parser().parse_args(["sql", "select 1"])
cfg = config.load(env={"VIGIL_DETECTORS_GRAD_SPIKE_WARN_Z": "9"})
assert cfg.detectors.grad_spike.warn_z == 9.0
bus.access(cfg, "reader")
print("\\n".join(sorted(sys.modules)))
"""


def test_what_vigil_sql_imports_to_ask_a_daemon_loads_no_daemon_work() -> None:
    """The command, its client, the daemon's configuration (detectors' tables included, read and checked), the
    reader's access and the data-dir question load none of :data:`HEAVY`, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _ASK_A_DAEMON], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "trainvigil.daemon.cli.sqlclient" in loaded and "trainvigil.daemon.broker.holders" in loaded
    leaked = [m for m in loaded if any(m == h or m.startswith(f"{h}.") for h in HEAVY)]
    assert not leaked, f"vigil sql's imports loaded {leaked}"


def test_the_detectors_load_on_first_use_of_their_names() -> None:
    """``trainvigil.daemon.detectors`` imports its settings alone; ``REGISTRY`` and the rest import the detectors."""
    code = (
        "import sys\n"
        "from trainvigil.daemon import detectors\n"
        "assert 'numpy' not in sys.modules\n"
        "assert len(detectors.REGISTRY) == len(detectors.build(detectors.DetectorsConfig()))\n"
        "assert 'numpy' in sys.modules and 'REGISTRY' in dir(detectors)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
