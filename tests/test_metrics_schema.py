"""metrics_schema: the one table of required fields and bounds per kind of metrics file, and the
check both readers (reports, `setdiff summary`) run on every file they read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metrics_schema import SCHEMAS, problems

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    "evaluate": "metrics/evaluate/*/*.json",
    "train": "metrics/train/*/*.json",
    "curve": "metrics/curve/*/*.json",
    "textgen": "metrics/textgen/*/*.json",
    "tradeoff": "metrics/tradeoff/*.json",
    "setsize": "metrics/setsize/*.json",
    "seeds": "metrics/seeds/*.json",
    "backbone": "metrics/backbone/*.json",
    "lmeval": "metrics/lmeval/*/summary.json",
    "lossless": "metrics/lossless/*.json",
}
EVALUATE = {
    "task": "arith",
    "paradigm": "ar",
    "nll_per_token": 0.1,
    "ppl": 1.1,
    "n_tokens": 100,
    "n_sequences": 4,
    "accuracy": 0.9,
    "score": 0.9,
    "n_answers": 10,
}


def test_every_kind_the_reports_read_has_a_schema() -> None:
    assert set(FILES) == set(SCHEMAS)


@pytest.mark.parametrize("kind", sorted(FILES))
def test_the_committed_run_is_valid(kind: str) -> None:
    """No false alarms on what the pipeline really writes (the run committed under metrics/)."""
    for path in sorted(ROOT.glob(FILES[kind])):
        assert problems(kind, json.loads(path.read_text())) == [], path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"accuracy": float("nan")}, ["field 'accuracy' is NaN"]),
        ({"accuracy": 1.7}, ["field 'accuracy' = 1.7 outside [0, 1]"]),
        ({"n_tokens": -1}, ["field 'n_tokens' = -1 outside [0, inf]"]),
        ({"ppl": float("inf")}, ["field 'ppl' is inf"]),
        ({"accuracy": None}, ["field 'accuracy' is null"]),
        ({"accuracy": "0.9"}, ["field 'accuracy' = '0.9' is not a number"]),
        ({"extra": {"deep": [1.0, float("nan")]}}, ["field 'extra.deep[1]' is NaN"]),
    ],
)
def test_a_bad_value_is_named_with_its_field(change: dict, expected: list[str]) -> None:
    assert problems("evaluate", EVALUATE | change) == expected


def test_required_fields_and_fields_required_together() -> None:
    assert problems("evaluate", {})[:2] == ["field 'task' missing", "field 'paradigm' missing"]
    likelihood_only = {k: v for k, v in EVALUATE.items() if k not in ("accuracy", "score")}
    assert problems("evaluate", likelihood_only) == [
        "field 'accuracy' missing",
        "field 'score' missing",
    ]
    no_answers = {k: v for k, v in likelihood_only.items() if k != "n_answers"}
    assert problems("evaluate", no_answers) == []  # a task without answers (text)
    assert problems("evaluate", [1]) == ["unreadable: not a JSON object"]


def test_wildcards_name_the_row() -> None:
    setsize = {"rows": [{"accuracy": 0.5, "set_size": 2}, {"accuracy": 2.0, "set_size": 0}]}
    assert problems("setsize", setsize) == [
        "field 'rows.1.accuracy' = 2.0 outside [0, 1]",
        "field 'rows.1.set_size' = 0 outside [1, inf]",
    ]
    tradeoff = {"setdlm_vs_ar": {"speedup": 2.0, "ci95": [1.5, None]}, "points": []}
    assert problems("tradeoff", tradeoff) == []  # a CI end that could not be computed is null
    assert problems("tradeoff", {"setdlm_vs_ar": {"speedup": 2.0}}) == [
        "field 'setdlm_vs_ar.ci95' missing"
    ]
    tradeoff["ar_engines"] = {"vllm:c1": {"engine_over_own_ar": -1.0, "ci95": [1, 2]}, "x": "y"}
    assert problems("tradeoff", tradeoff) == [
        "field 'ar_engines.vllm:c1.engine_over_own_ar' = -1.0 outside [0, inf]"
    ]
