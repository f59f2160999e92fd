"""What a test reads of a running daemon and its processes: ``/metrics`` over plain HTTP and ``/proc``."""

from __future__ import annotations

import socket
from pathlib import Path

STEPS_SERIES = 'vigil_events_ingested_total{kind="steps"}'
"""The ``/metrics`` series counting the steps the daemon has stored."""


def scrape(port: int) -> dict[str, float]:
    """The daemon's ``/metrics`` as series → value (read to the end: the request asks to close after one answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    _, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    series = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            series[name] = float(value)
    return series


def steps_committed(port: int) -> int:
    """How many steps the daemon serving ``/metrics`` on ``port`` has stored."""
    return int(scrape(port)[STEPS_SERIES])


def memory_mib(pid: int, field: str = "VmHWM") -> float:
    """A memory line of ``/proc/<pid>/status`` in MiB: ``VmHWM`` (peak resident set) or ``VmRSS`` (now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")
