"""The Grafana dashboards' queries against a real Prometheus scraping a real daemon that ingests a real run:
every PromQL expression in ``deploy/grafana/dashboards/*.json`` (panels, annotations, the run variable)
returns data. Without Grafana: its part is to draw what these queries return. ``promtool`` checks the
Prometheus configuration the compose file mounts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessDaemon
from support import NatsServer, wait_for

from trainvigil.daemon.broker.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
RUN = "grafana-run"
TRAIN = f"""
import math, time, trainvigil
agent = trainvigil.init(run_id={RUN!r}, flush_interval=0.05)
for step in range(400):
    agent.log(step, loss=math.nan if step >= 150 else 1.0 / (step + 1), grad_norm=1.0, step_time=0.01)
    time.sleep(0.01)
assert agent.close(timeout=60)
"""

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs Debian's prometheus package (prometheus and promtool; .ci/run installs it)",
)


def _expressions() -> list[tuple[str, str, str]]:
    """(dashboard, where, PromQL) of every query in the dashboards."""
    found = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            found += [(path.name, f"panel {panel['title']!r}", t["expr"]) for t in panel["targets"]]
        found += [(path.name, f"annotation {a['name']!r}", a["expr"]) for a in board["annotations"]["list"]]
    return found


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture
def prometheus(tmp_path: Path, nats_server: NatsServer) -> Iterator[tuple[str, InProcessDaemon]]:
    daemon = InProcessDaemon(nats_server.url, tmp_path / "data")
    daemon.start()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: trainvigil\n    static_configs: [{{targets: ['127.0.0.1:{daemon.http_port}']}}]\n"
    )
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    server = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 30, "prometheus ready")
        yield url, daemon
    finally:
        server.terminate()
        server.wait(30)
        daemon.terminate()


def test_the_compose_prometheus_configuration_passes_promtool() -> None:
    checked = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(ROOT / "deploy" / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_dashboard_query_returns_data(prometheus: tuple[str, InProcessDaemon]) -> None:
    url, daemon = prometheus
    began = time.time()
    # NaN losses from step 150 on keep a page open (non_finite): the alert panels and the annotation show it.
    env = {**os.environ, "VIGIL_NATS_URL": daemon.nats_url}
    done = subprocess.run([sys.executable, "-c", TRAIN], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    scraped = f'count_over_time(vigil_run_last_step{{run_id="{RUN}"}}[5m])'

    def enough_samples() -> bool:
        result = _get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': scraped})}")["data"]["result"]
        return bool(result) and float(result[0]["value"][1]) >= 3

    wait_for(enough_samples, 60, "three scrapes of the run's gauges")
    labels = _get(f"{url}/api/v1/label/run_id/values?{urllib.parse.urlencode({'match[]': 'vigil_run_last_step'})}")
    assert RUN in labels["data"], "the run variable's label_values() lists the run"
    expressions = _expressions()
    assert len(expressions) >= 15
    empty = []
    for board, where, expr in expressions:
        query = expr.replace("$run_id", RUN)
        params = {"query": query, "start": began - 60, "end": time.time(), "step": "1"}
        answer = _get(f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
        assert answer["status"] == "success", (board, where, answer)
        if not answer["data"]["result"]:
            empty.append(f"{board} {where}: {query}")
    assert not empty, "queries that returned no data:\n" + "\n".join(empty)
