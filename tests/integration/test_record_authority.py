"""A record carries the authority of whoever published it: an agent writes its own run's data, never alerts,
canary verdicts or another run's records.

One real daemon with its bundled nats-server and the ``--auth`` config for the module, a real webhook
receiver on 127.0.0.1; every forgery goes through the broker with the agent role's generated credentials,
as a training job that went rogue (or an attacker holding its file) would send it.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
from support import SecuredDaemon, wait_for
from webhook_server import HookServer, hook_server

import trainvigil
from trainvigil.daemon.alerts.format import chat_escape
from trainvigil.daemon.batch.decode import Forgery, RawMessage, decode_batch
from trainvigil.daemon.detectors._base import episode_id
from trainvigil.daemon.ingest._forgery import ForgeryPages
from trainvigil.schemas import (
    Anomaly,
    CanaryResult,
    CheckpointDigest,
    Envelope,
    RunEnd,
    RunEvent,
    Source,
    StepBatch,
    encode,
)
from trainvigil.schemas.credentials import BusAccess
from trainvigil.schemas.records import Column

FORGERY = "forged_record"
YEAR_2099 = 4_070_908_800.0


@pytest.fixture(scope="module")
def hook() -> Iterator[HookServer]:
    with hook_server(200) as server:
        yield server


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory, hook: HookServer) -> Iterator[SecuredDaemon]:
    daemon = SecuredDaemon(tmp_path_factory.mktemp("authority") / "data", env={"VIGIL_ALERTS_WEBHOOK_URL": hook.url})
    daemon.start()
    yield daemon
    if daemon.process is not None and daemon.process.poll() is None:
        daemon.terminate()


async def _publish_as_agent(bus: SecuredDaemon, items: list[tuple[str, bytes]]) -> None:
    """Publish ``items`` into the stream with the agent role's credentials, each acked by JetStream."""
    nc = await nats.connect(bus.nats_url, allow_reconnect=False, **BusAccess(str(bus.creds("agent"))).connect_options())
    try:
        js = nc.jetstream()
        for subject, payload in items:
            await js.publish(subject, payload, timeout=10)
    finally:
        await nc.close()


def publish_as_agent(bus: SecuredDaemon, *items: tuple[str, bytes]) -> None:
    asyncio.run(_publish_as_agent(bus, list(items)))


def _envelope(run_id: str, *records: Any, seq: int = 1) -> bytes:
    return encode(Envelope(source=Source(run_id=run_id, host="rogue"), seq=seq, records=list(records)))


def _sentinel(bus: SecuredDaemon, run_id: str, name: str) -> None:
    """A valid event of ``run_id`` on its own subject, behind what came before it: once it is stored, so is
    (or was refused) everything published ahead of it."""
    publish_as_agent(bus, (f"vigil.v1.{run_id}.run", _envelope(run_id, RunEvent(time=1.0, kind=name), seq=99)))
    query = f"select count(*) from events where run_id = '{run_id}' and kind = '{name}'"
    wait_for(lambda: bus.scalar(query) == 1, 30, f"the sentinel {name}")


def _metrics(bus: SecuredDaemon) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{bus.http_port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return text


def _series(text: str, family: str) -> set[str]:
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.startswith(family + "{")}


def _value(text: str, series: str) -> float:
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " ")]
    return found[0] if found else 0.0


def _victim_page(bus: SecuredDaemon, run_id: str) -> str:
    """A real agent (the agent role's file) whose loss turns NaN at step 50 and then ends cleanly: ``non_finite``
    pages and the episode stays open (fewer than its cooldown of steps follow). Returns the episode id."""
    agent = trainvigil.init(run_id=run_id, nats_url=bus.nats_url, nats_creds=str(bus.creds("agent")))
    for step in range(60):
        agent.log(step, loss=float("nan") if step == 50 else 1.0 / (step + 1))
    assert agent.close(timeout=30)
    query = f"select episode from anomalies where run_id = '{run_id}' and detector = 'non_finite'"
    wait_for(lambda: bool(bus.sql(query).rows), 30, "the victim's real page")
    episode: str = bus.scalar(query)
    return episode


def test_an_agent_cannot_store_alerts_or_canary_verdicts_and_the_attempt_pages_once(
    bus: SecuredDaemon, hook: HookServer
) -> None:
    episode = _victim_page(bus, "victim")
    assert episode.startswith("non_finite:victim:0:50:") and len(episode) > len("non_finite:victim:0:50:"), episode
    wait_for(lambda: any(p.get("episode") == episode for p in hook.requests), 30, "the real page's post")
    before = _series(_metrics(bus), "vigil_anomalies_total")
    # The real episode's id, even known exactly, closes nothing; a page of another run, a passing canary verdict
    # and 500 detector names (as many /metrics series) are all refused.
    clear = Anomaly(
        time=2.0, run_id="victim", rank=0, step=50, detector="non_finite", severity="page", state="cleared",
        episode=episode, message="[cleared: recovered] all fine",
    )  # fmt: skip
    other = Anomaly(
        time=2.0, run_id="someone-else", rank=0, step=1, detector="non_finite", severity="page",
        message="<!channel> pwned: restart everything at <http://evil.example|the runbook>",
    )  # fmt: skip
    verdict = CanaryResult(time=2.0, name="canary-forged", fault="nan", passed=True, verdict="pass")
    names = [
        Anomaly(time=2.0, run_id="victim", rank=0, step=1, detector=f"fake_{i}", severity="warn") for i in range(500)
    ]
    publish_as_agent(
        bus,
        ("vigil.v1.attacker.run", _envelope("attacker", clear, other, verdict)),
        ("vigil.v1.attacker.run", _envelope("attacker", *names, seq=2)),
    )
    _sentinel(bus, "attacker", "after-forgery")

    assert bus.sql(f"select state from anomalies where episode = '{episode}'").rows == [["open"]], "still open, once"
    assert bus.scalar("select count(*) from anomalies where run_id = 'someone-else' or detector like 'fake_%'") == 0
    assert bus.scalar("select count(*) from canary_results") == 0
    letters = bus.sql("select subject, reason, error from dead_letters where subject = 'vigil.v1.attacker.run'").rows
    assert [(s, r) for s, r, _ in letters] == [("vigil.v1.attacker.run", "forged")] * 2
    assert "anomaly" in letters[0][2] and "canary" in letters[0][2], letters[0][2]
    pages = bus.sql(f"select run_id, severity, state, message from anomalies where detector = '{FORGERY}'").rows
    assert len(pages) == 1, "one page per run, the second attempt only counted"
    run_id, severity, state, message = pages[0]
    assert (run_id, severity, state) == ("attacker", "page", "open")
    assert "vigil.v1.attacker.run" in message and "anomaly" in message and "canary" in message, message

    text = _metrics(bus)
    assert "fake_" not in text
    assert _series(text, "vigil_anomalies_total") - before == {
        f'vigil_anomalies_total{{detector="{FORGERY}",severity="page",state="open"}}'
    }
    assert _value(text, 'vigil_dead_letters_total{reason="forged"}') == 2
    assert _value(text, 'vigil_forged_records_total{kind="anomaly"}') == 502
    assert _value(text, 'vigil_forged_records_total{kind="canary"}') == 1
    wait_for(lambda: any(p.get("detector") == FORGERY for p in hook.requests), 30, "the forgery page's post")
    assert not [p for p in hook.requests if "pwned" in str(p)], "the forged page was never posted"
    assert [p["run_id"] for p in hook.requests if p.get("detector") == FORGERY] == ["attacker"]


def _bound_victim(bus: SecuredDaemon, tmp_path: Path) -> str:
    """A real run that saves a checkpoint and ends ``ok``; returns the checkpoint's root digest."""
    agent = trainvigil.init(run_id="bound-victim", nats_url=bus.nats_url, nats_creds=str(bus.creds("agent")))
    for step in range(20):
        agent.log(step, loss=1.0 / (step + 1))
    agent.checkpoint_saved(str(tmp_path / "ckpt.pt"), {"w": np.arange(16, dtype=np.float32)}, step=19).result(30)
    assert agent.close(timeout=30)
    query = "select root from checkpoints where run_id = 'bound-victim'"
    wait_for(lambda: bool(bus.sql(query).rows), 30, "the victim's checkpoint")
    wait_for(lambda: bus.scalar("select status from runs where run_id = 'bound-victim'") == "ok", 30, "its end")
    root: str = bus.scalar(query)
    return root


def test_a_run_is_bound_to_the_subject_it_is_published_on(bus: SecuredDaemon, tmp_path: Path) -> None:
    root = _bound_victim(bus, tmp_path)
    checkpoints = "select time, step, origin, root from checkpoints where run_id = 'bound-victim' order by time"
    ends = "select fields from events where run_id = 'bound-victim' and kind = 'run_end'"
    kept = (bus.sql(checkpoints).rows, bus.sql(ends).rows)
    end = RunEnd(time=YEAR_2099 - 1, status="error", error="RuntimeError: forged")
    save = CheckpointDigest(time=YEAR_2099, step=10**6, algo="blake3", root=root, path="/attacker/ckpt.pt")
    publish_as_agent(
        bus,
        ("vigil.v1.attacker.run", _envelope("bound-victim", end)),
        ("vigil.v1.attacker.ckpt", _envelope("bound-victim", save, seq=2)),
    )
    _sentinel(bus, "attacker", "after-mismatch")

    assert bus.scalar("select status from runs where run_id = 'bound-victim'") == "ok"
    assert (bus.sql(checkpoints).rows, bus.sql(ends).rows) == kept, "the victim's history is untouched"
    assert bus.scalar(f"select count(*) from checkpoints where root = '{root}'") == 1, "no one else wrote its digest"
    letters = bus.sql(
        "select subject, reason, error from dead_letters where reason = 'run_mismatch' order by stream_seq"
    ).rows
    assert [(s, r) for s, r, _ in letters] == [
        ("vigil.v1.attacker.run", "run_mismatch"),
        ("vigil.v1.attacker.ckpt", "run_mismatch"),
    ]
    assert "bound-victim" in letters[0][2] and "attacker" in letters[0][2], letters[0][2]
    assert _value(_metrics(bus), 'vigil_dead_letters_total{reason="run_mismatch"}') == 2


CRASH = """
import sys, trainvigil
vigil = trainvigil.init(run_id=sys.argv[1], flush_interval=0.05)
for step in range(5):
    vigil.log(step, loss=1.0)
raise RuntimeError(sys.argv[2])
"""


def test_agent_text_reaches_the_webhook_escaped_for_chat(bus: SecuredDaemon, hook: HookServer) -> None:
    """A crash's message is the agent's text: ``run_failed`` pages with it, and chat markup in it stays text."""
    said = "<!channel> @here see <http://evil.example|the runbook> or [docs](https://evil.example) & @everyone"
    env = {**os.environ, "VIGIL_NATS_URL": bus.nats_url, "VIGIL_NATS_CREDS": str(bus.creds("agent"))}
    done = subprocess.run([sys.executable, "-c", CRASH, "crashed", said], env=env, capture_output=True, timeout=120)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    wait_for(lambda: [p for p in hook.requests if p["run_id"] == "crashed"], 30, "the run_failed page's post")
    posted = next(p for p in hook.requests if p["run_id"] == "crashed")
    text = posted["text"]
    assert posted["detector"] == "run_failed" and "[PAGE] run_failed open on run crashed" in text
    assert "&lt;!channel&gt;" in text and "<!channel>" not in text and "<http" not in text
    assert not re.search(r"@(here|channel|everyone)\b", text), text
    assert "](" not in text and "://" not in text, "no link a chat renders"
    assert said in posted["message"], "the data field carries the text as it was, for programs"


WJ = "\u2060"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("loss is nan at step 37: lower the LR", "loss is nan at step 37: lower the LR"),
        ("<!channel> <!here> <@U0123>", f"&lt;!channel&gt; &lt;!here&gt; &lt;@{WJ}U0123&gt;"),
        ("<http://evil.example|the runbook>", f"&lt;http:{WJ}//evil.example|the runbook&gt;"),
        ("a & b &amp; c", "a &amp; b &amp;amp; c"),
        ("@here @channel @everyone @all", f"@{WJ}here @{WJ}channel @{WJ}everyone @{WJ}all"),
        ("[docs](https://evil.example)", f"[docs]{WJ}(https:{WJ}//evil.example)"),
        ("one\nline\r\n2023-01-01 [PAGE] fake\u2028x\ty", "one line 2023-01-01 [PAGE] fake x y"),
        ("a@ b @ c", "a@ b @ c"),
    ],
)
def test_chat_escape_leaves_no_mention_link_or_line_break_a_chat_renders(text: str, shown: str) -> None:
    assert chat_escape(text) == shown


def _steps(run_id: str) -> bytes:
    steps = np.arange(3, dtype="<i8")
    values = np.ones(3, dtype="<f8")
    batch = StepBatch(
        time=1.0,
        step=steps.tobytes(),
        times=np.full(3, 1.7e9, dtype="<f8").tobytes(),
        columns={"loss": Column(values=values.tobytes())},
    )
    return _envelope(run_id, batch)


@pytest.mark.parametrize(
    ("subject", "run_id", "reason"),
    [
        ("vigil.v1.a.metrics", "a", None),
        ("vigil.v1.3.a.metrics", "a", None),  # a shard's partitioned subject
        ("vigil.v1.a_b.metrics", "a.b", None),  # the token of a run id with a dot
        ("vigil.v1._ctl.metrics", "ctl", None),  # a reserved word, prefixed
        ("vigil.v1.b.metrics", "a", "run_mismatch"),
        ("vigil.v1.3.b.metrics", "a", "run_mismatch"),
        ("vigil.v1.a.metrics", "b", "run_mismatch"),
    ],
)
def test_decoding_binds_the_envelopes_run_to_its_subject_plain_or_sharded(
    subject: str, run_id: str, reason: str | None
) -> None:
    batch = decode_batch([RawMessage(subject, _steps(run_id), 1)])
    assert [d.reason for d in batch.dead_letters] == ([reason] if reason else [])
    assert len(batch.steps) == (0 if reason else 1)


def test_decoding_refuses_every_daemon_only_record_whatever_rides_with_it() -> None:
    page = Anomaly(time=1.0, run_id="a", rank=0, step=1, detector="d", severity="page")
    event = RunEvent(time=1.0, kind="fine")
    batch = decode_batch([RawMessage("vigil.v1.a.run", _envelope("a", event, page), 1)])
    assert [d.reason for d in batch.dead_letters] == ["forged"]
    assert batch.events == [] and batch.anomalies == [], "the whole message is refused"
    assert [(f.subject, f.run_id, f.kinds) for f in batch.forged] == [("vigil.v1.a.run", "a", {"anomaly": 1})]


def test_forgeries_page_once_per_run_and_at_most_the_hourly_budget_of_runs() -> None:
    pager = ForgeryPages(per_hour=2)

    def forged(*runs: str) -> list[Forgery]:
        return [Forgery(f"vigil.v1.{run}.run", run, {"anomaly": 1}) for run in runs]

    first = pager.pages(forged("a", "a", "b"), now=0.0)
    assert [(p.run_id, p.value) for p in first] == [("a", 2.0), ("b", 1.0)], "one page per run, its attempts counted"
    assert pager.pages(forged("a", "b"), now=10.0) == [], "a run pages once"
    over = pager.pages(forged("c", "d"), now=20.0)
    assert [p.run_id for p in over] == ["_daemon"] and "more than 2 runs" in over[0].message
    assert pager.pages(forged("e"), now=30.0) == [], "the budget's page goes out once an hour"
    later = pager.pages(forged("c", "a"), now=3600.0)
    assert [p.run_id for p in later] == ["c"], "a run past the budget pages in a later hour; a paged one never again"
    assert len({p.episode for p in [*first, *over, *later]}) == 4


def test_an_episode_id_is_the_same_within_the_daemons_process_and_cannot_be_computed_outside_it() -> None:
    ours = episode_id("non_finite", "victim", 0, 50)
    assert ours == episode_id("non_finite", "victim", 0, 50), "every update of one incident shares the id"
    assert ours.startswith("non_finite:victim:0:50:") and ours != episode_id("non_finite", "victim", 0, 51)
    code = "from trainvigil.daemon.detectors._base import episode_id; print(episode_id('non_finite', 'victim', 0, 50))"
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert theirs.stdout.strip().startswith("non_finite:victim:0:50:") and theirs.stdout.strip() != ours
