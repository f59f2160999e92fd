"""The web view's trust boundary on a real ``vigil up``: the ``Host`` names it answers (DNS rebinding), the
headers every answer carries (framing, sniffing, referrers, a strict content policy), the warning when it
listens beyond loopback without a token, connections a slow client may hold (slow-loris), and the one
request that answers many metrics' series.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from support import Daemon, NatsServer, serving, wait_for

import trainvigil
from trainvigil.daemon.web.connections import HEAD_TIMEOUT_S
from trainvigil.daemon.web.data import MAX_SERIES_METRICS

MANY, MANY_METRICS, MANY_STEPS = "many-metrics", 300, 12
PAGES = ("/", "/run?id=x", "/compare", "/alerts")
WARNING = "http_without_token"


def _metric(i: int) -> str:
    return f"m{i:03d}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("trust")
    os.environ.setdefault("VIGIL_SPILL_DIR", str(root / "spill"))
    with serving(root) as daemon:
        agent = trainvigil.init(MANY, 0, daemon.nats_url, flush_interval=0.05)
        try:
            for step in range(MANY_STEPS):
                agent.log(step, loss=1.0 / (step + 1), **{_metric(i): i + step / 10 for i in range(MANY_METRICS)})
            assert agent.flush(30)
        finally:
            agent.close(5)
        wait_for(lambda: daemon.scalar("select count(*) from steps") == MANY_STEPS, 30, "every step committed")
        yield daemon


def _ask(port: int, path: str, host: str, timeout: float = 10) -> http.client.HTTPResponse:
    """``GET path`` with exactly the ``Host`` header given; the answer is read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host)
        conn.endheaders()
        answer = conn.getresponse()
        answer.read()
        return answer
    finally:
        conn.close()


def _body(port: int, path: str, host: str = "127.0.0.1") -> bytes:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        assert answer.status == 200, (path, answer.status)
        return answer.read()
    finally:
        conn.close()


# ---- Host: a page on another site that rebinds its name to the daemon's address reads nothing ----------


@pytest.mark.parametrize(
    "path", ["/", "/api/runs", "/api/run?id=many-metrics", "/static/vigil.js", "/healthz", "/metrics"]
)
@pytest.mark.parametrize("host", ["attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io:{port}"])
def test_a_host_that_names_no_address_of_the_daemon_is_refused_on_every_path(
    site: Daemon, path: str, host: str
) -> None:
    answer = _ask(site.http_port, path, host.format(port=site.http_port))
    assert answer.status == 421, (path, host)
    assert answer.getheader("Content-Type", "").startswith("text/plain")


def test_the_refusal_says_which_setting_lets_a_name_in(site: Daemon) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.http_port, timeout=10)
    conn.putrequest("GET", "/api/runs", skip_host=True)
    conn.putheader("Host", "attacker.example")
    conn.endheaders()
    text = conn.getresponse().read().decode()
    conn.close()
    assert "http_allowed_hosts" in text and "VIGIL_HTTP_ALLOWED_HOSTS" in text and MANY not in text
    assert len(text.splitlines()) == 1


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/api/runs", "/"])
@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.1"])
def test_the_loopback_daemon_answers_its_own_names(site: Daemon, path: str, host: str) -> None:
    named = host.format(port=site.http_port)
    assert _ask(site.http_port, path, named).status == 200, (path, named)


def test_a_daemon_on_loopback_does_not_warn(site: Daemon) -> None:
    assert WARNING not in site.log.read_text()


# ---- headers: no framing, no sniffing, no referrer, scripts and styles from the daemon's own files only -------


def _csp(value: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (part.strip() for part in value.split(";")) if d}


@pytest.mark.parametrize(
    ("path", "status", "host"),
    [
        ("/", 200, "127.0.0.1"),
        ("/run?id=many-metrics", 200, "127.0.0.1"),
        ("/api/runs", 200, "127.0.0.1"),
        ("/api/live", None, "127.0.0.1"),
        ("/static/vigil.js", 200, "127.0.0.1"),
        ("/healthz", 200, "127.0.0.1"),
        ("/metrics", 200, "127.0.0.1"),
        ("/no-such-page", 404, "127.0.0.1"),
        ("/api/series?id=x&metric=loss&lo=nan", 400, "127.0.0.1"),
        ("/", 421, "attacker.example"),
    ],
)
def test_every_answer_forbids_framing_sniffing_referrers_and_foreign_or_inline_scripts(
    site: Daemon, path: str, status: int | None, host: str
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.http_port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        answer = conn.getresponse()  # the event stream: its head only
        if status is not None:
            assert answer.status == status
        assert answer.getheader("X-Frame-Options") == "DENY"
        assert answer.getheader("X-Content-Type-Options") == "nosniff"
        assert answer.getheader("Referrer-Policy") == "no-referrer"
        policy = _csp(answer.getheader("Content-Security-Policy", ""))
    finally:
        conn.close()
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["default-src"] == ["'self'"]
    for directive in ("script-src", "style-src"):
        assert policy.get(directive, policy["default-src"]) == ["'self'"], directive
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]


@pytest.mark.parametrize("path", PAGES)
def test_the_pages_hold_no_inline_script_style_or_handler(site: Daemon, path: str) -> None:
    html = _body(site.http_port, path).decode()
    scripts = re.findall(r"<script\b[^>]*>", html, re.I)
    assert scripts and all(re.search(r"\bsrc=", tag) for tag in scripts), scripts
    assert all(not body.strip() for body in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.I | re.S))
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=", html, re.I)


# ---- beyond loopback ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def everywhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon on every interface, no token, with two names of its own allowed."""
    allowed = {"VIGIL_HTTP_ALLOWED_HOSTS": "vigil-daemon, .vigil.example"}
    with serving(tmp_path_factory.mktemp("everywhere"), allowed, args=["--http-host", "0.0.0.0"]) as daemon:
        yield daemon


def test_on_every_interface_without_a_token_the_daemon_warns_once_saying_how_to_set_one(everywhere: Daemon) -> None:
    lines = [line for line in everywhere.log.read_text().splitlines() if WARNING in line]
    assert len(lines) == 1, lines
    assert "anyone who can reach" in lines[0] and "reads every run" in lines[0]
    assert "VIGIL_HTTP_TOKEN_FILE" in lines[0]


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("vigil-daemon:9464", 200),  # allowed, by name (a compose service, as Prometheus scrapes it)
        ("VIGIL-DAEMON", 200),
        ("a.vigil.example", 200),  # allowed, a subdomain
        ("vigil.example", 200),
        ("10.1.2.3:9464", 200),  # an address: no DNS answer can put another site's page behind it
        ("[fd00::1]", 200),
        ("localhost:{port}", 200),
        ("{hostname}", 200),  # the machine's own name
        ("attacker.example", 421),
        ("vigil-daemon.attacker.example", 421),
        ("vigil.example.attacker.example", 421),
    ],
)
def test_on_every_interface_the_daemon_answers_addresses_its_names_and_the_allowed_ones(
    everywhere: Daemon, host: str, status: int
) -> None:
    named = host.format(port=everywhere.http_port, hostname=socket.gethostname())
    assert _ask(everywhere.http_port, "/metrics", named).status == status, named


# ---- slow-loris: partial requests held open neither starve the health probe nor run out of descriptors -----


@contextmanager
def _open_files_limit(most: int) -> Iterator[None]:
    """Processes started meanwhile may open at most ``most`` files (this one's limit is put back after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:  # nothing yet: still open
        return False
    except OSError:  # reset
        return True


def test_health_answers_while_1100_partial_requests_are_held_and_no_descriptor_runs_out(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    partial, most_files = 1100, 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(hard, 8192) < partial + 200:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    daemon = Daemon(nats_server.url, tmp_path / "data")
    with _open_files_limit(most_files):
        daemon.launch()
    held: list[socket.socket] = []
    try:
        daemon.wait_ready()
        assert daemon.process is not None
        for _ in range(partial):
            sock = socket.create_connection(("127.0.0.1", daemon.http_port), timeout=10)
            held.append(sock)
            with suppress(OSError):  # already let go by the daemon
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(5):
            # A generous bound: a probe that waits in the accept queue behind the held connections times out.
            answer = _ask(daemon.http_port, "/healthz", "127.0.0.1", timeout=10)
            assert answer.status == 200
        fds = len(os.listdir(f"/proc/{daemon.process.pid}/fd"))
        assert fds < most_files - 100, f"the daemon holds {fds} descriptors of {most_files}"
        # A request head not finished in time is let go: every held connection ends, none waits for ever.
        wait_for(lambda: all(_closed_by_peer(s) for s in held), HEAD_TIMEOUT_S + 30, "the partial requests let go")
        assert _ask(daemon.http_port, "/healthz", "127.0.0.1").status == 200
        assert daemon.process.poll() is None
    finally:
        for sock in held:
            sock.close()
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
    log = daemon.log.read_text()
    assert "Too many open files" not in log and "out of system resource" not in log, log[-3000:]


# ---- many metrics' series in one request -------------------------------------------------------------------


def _json(port: int, path: str) -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_one_request_answers_many_metrics_series_as_the_per_metric_endpoint_does(site: Daemon) -> None:
    names = ["loss", *(_metric(i) for i in range(MAX_SERIES_METRICS - 1))]
    status, body = _json(site.http_port, f"/api/run/series?id={MANY}&" + "&".join(f"metric={m}" for m in names))
    assert status == 200, body
    assert isinstance(body, dict) and sorted(body["metrics"]) == sorted(names)
    for name in (names[0], names[1], names[-1]):
        status, one = _json(site.http_port, f"/api/series?id={MANY}&metric={name}")
        assert status == 200 and isinstance(one, dict)
        assert body["metrics"][name] == one["series"], name
    assert body["metrics"][names[-1]]["0"]["y"][0] == pytest.approx(MAX_SERIES_METRICS - 2)


def test_a_request_for_more_metrics_than_the_cap_is_refused_saying_the_cap(site: Daemon) -> None:
    names = [_metric(i) for i in range(MAX_SERIES_METRICS + 1)]
    status, body = _json(site.http_port, f"/api/run/series?id={MANY}&" + "&".join(f"metric={m}" for m in names))
    assert status == 400 and isinstance(body, dict)
    assert f"at most {MAX_SERIES_METRICS} metrics" in body["error"]
    status, body = _json(site.http_port, f"/api/run/series?id={MANY}")
    assert status == 400 and isinstance(body, dict) and "metric" in body["error"]
