"""Tests for setdiff.tasks: config validation, determinism, split hygiene, arithmetic, scoring."""

from __future__ import annotations

import dataclasses
import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from setdiff.config import ConfigError, build
from setdiff.params import Params
from setdiff.tasks import (
    ANSWER_TASKS,
    TASKS,
    DataConfig,
    Task,
    check_task,
    generate_splits,
    task_config,
)
from setdiff.tasks.arith import ArithConfig, generate_arith, running_total, score_arith
from setdiff.tasks.gsm import GSM_MARKER, GsmConfig, generate_gsm, gsm_record, score_gsm
from setdiff.tasks.records import SPLIT_NAMES, Splits, extract_answer, from_jsonl, to_jsonl
from setdiff.tasks.text import KJV_BOOKS, TextConfig, generate_text, read_kjv

ARITH = {"n_train": 50, "n_valid": 20, "n_test": 20}


def section(cls: type[Any], values: dict[str, Any], key: str = "data.arith") -> Any:
    head, tail = key.split(".")
    return Params({head: {tail: values}}, Path("p.yaml")).section(key, cls)


# ---------------------------------------------------------------------------------------------
# config validation


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({**ARITH, "n_trian": 5}, "n_trian"),
        ({**ARITH, "n_train": "50"}, "data.arith.n_train"),
        ({**ARITH, "n_train": 2.5}, "data.arith.n_train"),
        ({**ARITH, "n_valid": 0}, "n_valid"),
        ({**ARITH, "min_terms": 1}, "min_terms"),
        ({**ARITH, "min_terms": 4, "max_terms": 3}, "max_terms"),
        ({**ARITH, "min_digits": 3}, "max_digits"),
        ({"n_train": 50, "n_valid": 20}, "n_test"),
        ({**ARITH, "n_train": 500, "max_terms": 2, "max_digits": 1}, "exceeds"),
    ],
)
def test_arith_config_errors_name_the_key(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)) as err:
        section(ArithConfig, values)
    assert "p.yaml: data.arith" in str(err.value)


def test_arith_capacity_counts_distinct_expressions() -> None:
    config = ArithConfig(n_train=1, n_valid=1, n_test=1, max_terms=2, max_digits=1)
    assert config.capacity() == 10 * 10 * 2
    assert section(ArithConfig, ARITH) == ArithConfig(**ARITH)


def test_gsm_config_errors() -> None:
    with pytest.raises(ConfigError, match="n_train"):
        section(GsmConfig, {"n_train": -1, "n_valid": 1, "n_test": 1}, "data.gsm")
    with pytest.raises(ConfigError, match="difficulty"):
        section(GsmConfig, {"n_train": 1, "n_valid": 1, "n_test": 1, "difficulty": 1}, "data.gsm")


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"valid_books": ["Ruth", "Revelations"], "test_books": ["Jonah"]}, "Revelations"),
        ({"valid_books": ["Ruth"], "test_books": ["Jonah", "Gospel of Thomas"]}, "test_books"),
        ({"valid_books": ["Ruth"], "test_books": ["Ruth"]}, "share"),
        ({"valid_books": [], "test_books": ["Jonah"]}, "valid_books"),
        ({"valid_books": "Ruth", "test_books": ["Jonah"]}, "valid_books"),
        ({"valid_books": ["Ruth"], "test_books": ["Jonah"], "max_train_verses": 0}, "max_train"),
        (
            {"valid_books": ["Ruth"], "test_books": [b for b in KJV_BOOKS if b != "Ruth"]},
            "no training",
        ),
    ],
)
def test_text_config_errors_name_the_problem(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        section(TextConfig, values, "data.text")


def test_data_config_builds_optional_sections() -> None:
    config = build(DataConfig, {"seed": 3, "arith": ARITH}, "data")
    assert config.arith == ArithConfig(**ARITH) and config.gsm is None and config.text is None
    assert task_config(config, "arith") == config.arith
    with pytest.raises(ConfigError, match=r"data\.gsm is absent"):
        task_config(config, "gsm")
    with pytest.raises(ConfigError, match="seed"):
        build(DataConfig, {"seed": "0"}, "data")
    with pytest.raises(ConfigError, match="n_trian"):
        build(DataConfig, {"seed": 0, "arith": {**ARITH, "n_trian": 1}}, "data")


def test_unknown_task_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'poetry'.*arith"):
        check_task("poetry")


# ---------------------------------------------------------------------------------------------
# arith


def test_running_total_example() -> None:
    assert running_total("5 - 65 - 51") == (["5-65=-60", "-60-51=-111"], -111)
    assert running_total("7 + 3") == (["7+3=10"], 10)
    with pytest.raises(ValueError, match="operator"):
        running_total("7 * 3")


@pytest.fixture(scope="module")
def arith_splits() -> Splits:
    return generate_arith(ArithConfig(**ARITH), seed=0)


def test_arith_is_deterministic_and_seed_dependent(arith_splits: Splits) -> None:
    again = generate_arith(ArithConfig(**ARITH), seed=0)
    other = generate_arith(ArithConfig(**ARITH), seed=1)
    for name in SPLIT_NAMES:
        assert to_jsonl(again[name]) == to_jsonl(arith_splits[name])
        assert to_jsonl(other[name]) != to_jsonl(arith_splits[name])


def test_arith_splits_sized_disjoint_and_unique(arith_splits: Splits) -> None:
    sizes = {name: len(rows) for name, rows in arith_splits.items()}
    assert sizes == {"train": 50, "valid": 20, "test": 20}
    prompts = [r["prompt"] for rows in arith_splits.values() for r in rows]
    assert len(prompts) == len(set(prompts)) == 90


def test_arith_test_split_does_not_depend_on_n_train(arith_splits: Splits) -> None:
    bigger = generate_arith(ArithConfig(**{**ARITH, "n_train": 80}), seed=0)
    assert bigger["test"] == arith_splits["test"] and bigger["valid"] == arith_splits["valid"]


def _check_target(record: dict[str, Any]) -> None:
    """Recompute every running-total step independently of `running_total`."""
    numbers = [int(n) for n in re.findall(r"\d+", record["prompt"])]
    ops = re.findall(r"[+-]", record["prompt"])
    steps, final = record["target"].split(" #")
    assert final == record["answer"] == str(eval(record["prompt"].rstrip("=")))  # noqa: S307
    total = numbers[0]
    for step, op, operand in zip(steps.split(" "), ops, numbers[1:], strict=True):
        match = re.fullmatch(r"(-?\d+)([+-])(\d+)=(-?\d+)", step)
        assert match is not None, step
        left, step_op, right, result = match.groups()
        assert (int(left), step_op, int(right)) == (total, op, operand)
        total = total + operand if op == "+" else total - operand
        assert int(result) == total
    assert total == int(record["answer"])


def test_arith_running_totals_are_right(arith_splits: Splits) -> None:
    records = [r for rows in arith_splits.values() for r in rows]
    assert {op for r in records for op in re.findall(r"[^\d=]", r["prompt"])} <= {"+", "-"}
    assert any(int(r["answer"]) < 0 for r in records)  # negative running totals occur
    for record in records:
        _check_target(record)
        assert record["entry"]["metadata"]["expression"].replace(" ", "") + "=" == record["prompt"]


def test_arith_record_is_json_round_trippable(arith_splits: Splits) -> None:
    record = arith_splits["test"][0]
    assert json.loads(json.dumps(record)) == record
    assert set(record) == {"prompt", "target", "answer", "question", "entry"}
    assert record["question"].startswith("State the final answer")


def test_score_arith_uses_the_generator_checker(arith_splits: Splits) -> None:
    for record in arith_splits["test"][:10]:
        entry = json.loads(json.dumps(record["entry"]))
        assert extract_answer(record["target"]) == record["answer"]
        assert score_arith(extract_answer(record["target"]), entry) == 1.0
        assert score_arith(record["answer"] + ".0", entry) == 1.0
        wrong = str(int(record["answer"]) + 1)
        assert score_arith(wrong, entry) < 1.0
        assert score_arith(None, entry) == 0.0


def test_extract_answer_edge_cases() -> None:
    assert extract_answer("1+2=3 # 3 ") == "3"
    assert extract_answer("no marker") is None
    assert extract_answer("1+2=3 #") is None
    assert extract_answer("steps\n#### 42", GSM_MARKER) == "42"
    assert extract_answer("steps\n#### 42") == "42"


# ---------------------------------------------------------------------------------------------
# gsm


def test_gsm_splits_and_scoring() -> None:
    splits = generate_gsm(GsmConfig(n_train=30, n_valid=10, n_test=10), seed=0)
    assert {name: len(rows) for name, rows in splits.items()} == {
        "train": 30,
        "valid": 10,
        "test": 10,
    }
    records = [r for rows in splits.values() for r in rows]
    assert len({r["prompt"] for r in records}) == len(records)
    for record in records:
        assert record["prompt"] == record["question"] == record["entry"]["question"]
        assert record["target"].endswith(f"\n#### {record['answer']}")
        assert record["target"].count("####") == 1
        answer = extract_answer(record["target"], GSM_MARKER)
        assert score_gsm(answer, record["entry"]) == 1.0
        assert score_gsm("123456789", record["entry"]) < 1.0
    assert to_jsonl(splits["train"]) == to_jsonl(
        generate_gsm(GsmConfig(n_train=30, n_valid=10, n_test=10), seed=0)["train"]
    )


def test_score_gsm_accepts_negative_answers() -> None:
    # The generator's own checker scores "-5" against "-5" as 0.01 (its regex drops the minus).
    entry = {"question": "Q?", "answer": "-5", "metadata": {}}
    assert score_gsm("-5", entry) == 1.0
    assert score_gsm("5", entry) < 1.0
    assert score_gsm("1,687.50", {"question": "Q?", "answer": "1687.5", "metadata": {}}) == 1.0
    assert score_gsm("NaN-ish", entry) == 0.0


def test_gsm_record_normalises_the_final_line_and_metadata() -> None:
    entry = {
        "question": "Q?",
        "answer": "36",
        "metadata": {"answer_cot": "a = 36.0\n#### 36.0", "variables": {"f": Fraction(1, 3)}},
    }
    record = gsm_record(entry)
    assert record["target"] == "a = 36.0\n#### 36"
    assert record["entry"]["metadata"]["variables"]["f"] == "1/3"
    bare = gsm_record({"question": "Q?", "answer": "5", "metadata": {}})
    assert bare["target"] == "#### 5"


# ---------------------------------------------------------------------------------------------
# text


@pytest.fixture(scope="module")
def kjv() -> list[dict[str, Any]]:
    return read_kjv()


def test_kjv_books_match_the_file(kjv: list[dict[str, Any]]) -> None:
    assert tuple(dict.fromkeys(v["book"] for v in kjv)) == KJV_BOOKS
    assert set(kjv[0]) == {"book", "chapter", "verse", "text"}
    assert kjv[0]["text"] == "In the beginning God created the heaven and the earth."
    assert not any(v["text"] == "[]" for v in kjv)


def test_text_split_by_book_with_cross_split_dedup(kjv: list[dict[str, Any]]) -> None:
    # "And the LORD spake unto Moses, saying," recurs in Exodus, Leviticus and Numbers.
    config = TextConfig(valid_books=("Ruth",), test_books=("Leviticus",))
    splits = generate_text(config, seed=0)
    assert {v["book"] for v in splits["valid"]} == {"Ruth"}
    assert {v["book"] for v in splits["test"]} == {"Leviticus"}
    assert not {"Ruth", "Leviticus"} & {v["book"] for v in splits["train"]}
    train_texts = {v["text"] for v in splits["train"]}
    held_out = {v["text"] for v in splits["valid"] + splits["test"]}
    assert not train_texts & held_out
    assert "And the LORD spake unto Moses, saying," not in train_texts
    kept = len(kjv) - len(splits["valid"]) - len(splits["test"])
    assert len(splits["train"]) < kept  # some duplicates were removed from train


def test_text_train_cap() -> None:
    config = TextConfig(valid_books=("Ruth",), test_books=("Jonah",), max_train_verses=100)
    splits = generate_text(config, seed=0)
    assert len(splits["train"]) == 100 and splits["train"][0]["book"] == "Genesis"
    assert len(splits["test"]) == 48


def test_generate_splits_checks_the_config_type() -> None:
    with pytest.raises(TypeError, match="ArithConfig"):
        generate_splits("arith", GsmConfig(n_train=1, n_valid=1, n_test=1), 0)


def test_jsonl_round_trip(arith_splits: Splits) -> None:
    payload = to_jsonl(arith_splits["valid"])
    assert from_jsonl(payload) == arith_splits["valid"]
    assert payload.count(b"\n") == len(arith_splits["valid"])


# ---------------------------------------------------------------------------------------------
# the registry


def test_data_config_and_answer_tasks_derive_from_the_registry() -> None:
    assert [f.name for f in dataclasses.fields(DataConfig)] == ["seed", *TASKS]
    assert list(ANSWER_TASKS) == ["arith", "gsm", "gsm8k"]
    assert {name: task.layout for name, task in TASKS.items()}["text"] == "stream"
    assert all(name == task.name for name, task in TASKS.items())


def test_task_scores_after_its_own_marker() -> None:
    entry = {"answer": "1,230"}
    assert TASKS["gsm8k"].score_text("so 1200 + 30\n#### 1230", entry) == ("1230", 1.0)
    with pytest.raises(ValueError, match="text.*no checkable answers"):
        TASKS["text"].score_text("#1", entry)


def test_a_task_needs_both_marker_and_scorer() -> None:
    with pytest.raises(ValueError, match="marker and score"):
        Task(name="x", config=ArithConfig, layout="pairs", generate=generate_arith, marker="#")
