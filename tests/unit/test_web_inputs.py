"""The run page's "logged name → detector input" rows, computed from the shared name mapping and the detectors'
default inputs (pure: no daemon)."""

from __future__ import annotations

from trainvigil.daemon.detectors import REGISTRY
from trainvigil.daemon.web import inputs
from trainvigil.daemon.web.data import _names
from trainvigil.schemas.names import DETECTOR_NAMES


def test_every_mapped_name_feeds_an_input_some_registered_detector_reads() -> None:
    read = inputs.readers()
    targets = {target.lstrip("-") for target in DETECTOR_NAMES.values()}
    assert {t for t in targets if not read.get(t)} == set(), "a mapping onto a name no detector reads"
    assert read["loss"] == ("non_finite", "loss_spike", "generalisation")
    assert read["step_time"] == ("slowdown", "straggler")
    assert set(read) <= {m for d in REGISTRY for m in inputs.reads(d)}


def test_an_alias_gets_a_row_its_detectors_copy_none_and_an_unread_name_feeds_nothing() -> None:
    rows = inputs.feeds(["Loss/train", "loss", "grad_norm", "my/objective", "samples"], {"my/objective": "-reward"})
    assert rows == [
        {"name": "Loss/train", "input": "loss", "negated": False,
         "detectors": ["non_finite", "loss_spike", "generalisation"]},
        {"name": "grad_norm", "input": "grad_norm", "negated": False, "detectors": ["non_finite", "grad_spike"]},
        {"name": "my/objective", "input": "reward", "negated": True, "detectors": ["non_finite", "reward_hack"]},
        {"name": "samples", "input": None, "negated": False, "detectors": []},
    ]  # fmt: skip


def test_the_detectors_with_no_input_logged_are_named_with_what_they_read() -> None:
    silent = {row["detector"]: row["reads"] for row in inputs.unfed(["loss", "step_time"])}
    assert silent == {"grad_spike": ["grad_norm"], "kl_explode": ["kl"],
                      "reward_hack": ["reward", "entropy", "kl", "response_len", "lr", "true_return", "eval_return",
                                      "eval_reward"]}  # fmt: skip
    assert inputs.unfed([]) and all(row["reads"] for row in inputs.unfed([]))


def test_a_malformed_names_event_leaves_the_built_in_mapping() -> None:
    assert _names('{"a": "loss"}') == {"a": "loss"}
    for bad in (None, "", "not json", '["a"]', '{"a": 1}'):
        assert _names(bad) == {}
