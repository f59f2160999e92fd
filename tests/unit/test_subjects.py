"""The subjects of a namespace: the default one is exactly the subjects without namespaces, a namespaced one
is the same with ``N.`` in front, and no wildcard of one namespace matches a subject of another."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from trainvigil.agents.options import resolve
from trainvigil.agents.spill._spill_check import foreign_frame
from trainvigil.agents.spill.outbox import OutMsg, frame, read_sealed_header, write_sealed
from trainvigil.daemon import config as config_mod
from trainvigil.daemon.broker.auth import permissions
from trainvigil.daemon.canary.environment import base_env, job_env
from trainvigil.errors import ConfigError
from trainvigil.schemas import DEFAULT_SUBJECTS, KINDS, Subjects
from trainvigil.schemas.shards import ShardId, parse_shard, partition_mappings, partition_subjects, probe_subject
from trainvigil.schemas.subjects import data_namespace

NAMESPACES = ("", "alpha", "vigil", "v1", "VIGIL", "alerts", "ctl", "metrics", "sql", "0", "a-b_C", "x" * 32)
"""Names that could confuse a matcher: the default, the tokens of every subject, digits, the longest."""


def _matches(pattern: str, subject: str) -> bool:
    """NATS's rule: ``*`` is one whole token, ``>`` one or more at the end, anything else itself."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def _patterns(s: Subjects) -> list[str]:
    """Every wildcard or subject a subscriber, stream, mapping or permission of namespace ``s`` names."""
    out = [f"{s.prefix}.>", s.alerts, s.control, *s.stream_subjects, *partition_subjects(subjects=s)]
    out += [f"{s.prefix}.*.metrics", f"{s.prefix}.*.*.metrics", f"{s.prefix}.*.*.probe", probe_subject("*", s)]
    out += list(partition_mappings(3, s))
    for role, sharded, runs in itertools.product(("agent", "reader"), (False, True), (None, ("vision-1",))):
        allowed = permissions(role, "u", sharded=sharded, runs=runs, subjects=s)
        assert allowed is not None
        out += [p for rule in allowed.values() for kind in rule.values() for p in kind if not p.startswith("_INBOX")]
    return out


def _concrete(s: Subjects) -> list[str]:
    """Subjects namespace ``s``'s processes publish on (a run named like a reserved token included)."""
    shard = ShardId(1, 3, s)
    out = [s.data(run, kind) for run in ("r", "ctl", "alerts", "vigil") for kind in KINDS]  # type: ignore[arg-type]
    out += [s.alert("r"), s.query, s.holders, s.roll_call, s.canary, shard.query_subject, shard.canary_subject]
    out += [f"{s.prefix}.1.r.{kind}" for kind in KINDS] + [probe_subject("t", s), f"{s.prefix}.1.t.probe"]
    return out


def test_the_default_namespace_is_exactly_the_subjects_and_stream_without_namespaces() -> None:
    s = Subjects()
    assert s == DEFAULT_SUBJECTS and s.prefix == "vigil.v1" and s.stream_name == "VIGIL"
    assert s.stream_subjects == [f"vigil.v1.*.{k}" for k in ("metrics", "gil", "ckpt", "run", "hb")]
    assert (s.data("a.b", "hb"), s.alert("r/1"), s.alerts) == (
        "vigil.v1.a_b.hb",
        "vigil.v1.alerts.r_1",
        "vigil.v1.alerts.>",
    )
    assert (s.query, s.holders, s.roll_call, s.canary, s.control) == (
        "vigil.v1.ctl.sql",
        "vigil.v1.ctl.sql.daemons",
        "vigil.v1.ctl.sql.shards",
        "vigil.v1.ctl.canary",
        "vigil.v1.ctl.>",
    )
    shard = parse_shard("1/4")
    assert (shard.query_subject, shard.canary_subject) == ("vigil.v1.ctl.sql.shard.1", "vigil.v1.ctl.canary.shard.1")
    assert shard.stream_subjects == [f"vigil.v1.1.*.{k}" for k in KINDS]
    assert partition_mappings(2)["vigil.v1.*.metrics"] == "vigil.v1.{{partition(2,1)}}.{{wildcard(1)}}.metrics"


def test_a_namespace_puts_its_name_in_front_of_every_subject_and_names_its_stream() -> None:
    s = Subjects("stg")
    for plain, spaced in zip(_concrete(DEFAULT_SUBJECTS), _concrete(s), strict=True):
        assert spaced == f"stg.{plain}"
    assert _patterns(s) == [f"stg.{p}" for p in _patterns(DEFAULT_SUBJECTS)]
    assert partition_mappings(2, s) == {f"stg.{k}": f"stg.{v}" for k, v in partition_mappings(2).items()}
    assert s.stream_name == "VIGIL_stg"


@pytest.mark.parametrize(("one", "other"), [(a, b) for a in NAMESPACES for b in NAMESPACES if a != b])
def test_no_pattern_of_one_namespace_matches_a_subject_of_another(one: str, other: str) -> None:
    """Wildcards of the default namespace (``vigil.v1.>``, ``vigil.v1.*.metrics``, ``vigil.v1.*.*.metrics``...)
    included, whatever the other namespace is called; the patterns match their own namespace's subjects."""
    mine, theirs = Subjects(one), Subjects(other)
    assert _matches(mine.alerts, mine.alert("r")) and _matches(mine.stream_subjects[0], mine.data("r", "metrics"))
    crossed = [(p, c) for p in _patterns(mine) for c in _concrete(theirs) if _matches(p, c)]
    assert crossed == []


@pytest.mark.parametrize("name", ["", "a", "0", "A-b_c", "x" * 32, "vigil"])
def test_a_valid_namespace(name: str) -> None:
    assert Subjects(name).namespace == name


@pytest.mark.parametrize("name", ["x" * 33, "-a", "_a", "a.b", "a b", "a*", "a>", "ä", "a/b", " a", "a\n"])
def test_any_other_namespace_is_a_config_error_naming_the_setting_and_the_rule(name: str) -> None:
    with pytest.raises(ConfigError, match=r"namespace \(VIGIL_NAMESPACE, --namespace\) must be empty, or 1-32") as e:
        Subjects(name)
    assert e.value.key == "namespace" and "\n" not in str(e.value).replace(repr(name), "")


def test_data_namespace_tells_whose_data_a_subject_is() -> None:
    assert data_namespace("vigil.v1.r.metrics") == "" and data_namespace("stg.vigil.v1.r.hb") == "stg"
    assert data_namespace("vigil.vigil.v1.r.run") == "vigil"
    for subject in ("vigil.v1.alerts.r", "stg.vigil.v1.ctl.sql", "vigil.v1.0.r.metrics", "x.y.vigil.v1.r.hb"):
        assert data_namespace(subject) is None, subject
    assert Subjects("stg").data_run("stg.vigil.v1.r.gil") == "r" and Subjects("stg").data_run("vigil.v1.r.gil") is None


def test_the_daemon_and_the_agent_read_the_namespace_like_any_other_setting() -> None:
    cfg = config_mod.load(env={"VIGIL_NAMESPACE": "stg"}).for_shard()
    assert (cfg.namespace, cfg.stream.name, cfg.stream.consumer) == ("stg", "VIGIL_stg", "vigil-daemon")
    assert cfg.stream_subjects == Subjects("stg").stream_subjects
    named = config_mod.load(env={"VIGIL_NAMESPACE": "stg", "VIGIL_STREAM_NAME": "MINE"}).for_shard()
    assert named.stream.name == "MINE", "an explicit stream.name wins"
    env = {"VIGIL_NAMESPACE": "stg", "VIGIL_SHARD": "1/2", "VIGIL_NATS_URL": "nats://a:1"}
    shard = config_mod.load(env=env).for_shard()
    assert (shard.stream.name, shard.stream_subjects[0]) == ("VIGIL_stg-1", "stg.vigil.v1.1.*.metrics")
    assert shard.shard_id is not None and shard.shard_id.query_subject == "stg.vigil.v1.ctl.sql.shard.1"
    with pytest.raises(ConfigError, match="namespace"):
        config_mod.load(env={"VIGIL_NAMESPACE": "a.b"})

    options, _ = resolve("r", None, None, {}, env={"VIGIL_NAMESPACE": "stg"})
    assert options.subjects.data("r", "metrics") == "stg.vigil.v1.r.metrics"
    assert resolve("r", None, None, {"namespace": ""}, env={"VIGIL_NAMESPACE": "stg"})[0].namespace == ""
    with pytest.raises(ConfigError, match="namespace"):
        resolve("r", None, None, {"namespace": "a b"}, env={})


def test_canary_jobs_get_their_daemons_namespace_and_no_other() -> None:
    spaced = config_mod.load(env={"VIGIL_NAMESPACE": "stg"})
    inherited = {"VIGIL_NAMESPACE": "prod", "PATH": "/bin"}
    base = base_env(spaced, "nats://b:1", inherited)
    assert base["VIGIL_NAMESPACE"] == "stg" and base["PATH"] == "/bin"
    assert job_env(base, "canary-1", "", {"VIGIL_NAMESPACE": "prod"})["VIGIL_NAMESPACE"] == "stg"
    plain = base_env(config_mod.load(env={}), "nats://b:1", inherited)
    assert "VIGIL_NAMESPACE" not in plain, "the default namespace's canaries get none, whatever the daemon inherited"
    assert "VIGIL_NAMESPACE" not in job_env(plain, "canary-1", "", {"VIGIL_NAMESPACE": "prod"})


def test_a_spill_file_of_another_namespace_is_refused_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "r-r0-p1-n.spill"
    write_sealed(
        path, "nats://b:1", (frame(OutMsg(Subjects("stg").data("r", "run"), f"r/{i}", b"x", 1)) for i in range(2))
    )
    with open(path, "rb") as f:
        read_sealed_header(f)
        assert foreign_frame(f, Subjects("stg")) == ""
        why = foreign_frame(f)
        assert "namespace 'stg'" in why and "the default namespace" in why and why.startswith("frame 1 ")
        assert "namespace 'stg'" in foreign_frame(f, Subjects("prod")) and "'prod'" in foreign_frame(
            f, Subjects("prod")
        )
