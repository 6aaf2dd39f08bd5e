"""The ``gsm`` task: GSM8K-style word problems from reasoning-gym ``gsm_symbolic``.

prompt = the question, target = the generator's worked solution (its ``answer_cot``) ending in
``"#### <answer>"``. Scoring calls ``gsm_symbolic``'s own checker on the stored ``entry``, after
an exact numeric match.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from setdiff.config import frozen
from setdiff.tasks.gym import checker, reasoning_gym
from setdiff.tasks.records import (
    Record,
    Splits,
    assign_unique,
    attempt_budget,
    check_counts,
    derive_seed,
    json_safe,
    same_number,
    split_counts,
)

GSM_MARKER = "####"
"""Separates the gsm worked solution from the final answer (GSM8K convention)."""


@frozen
class GsmConfig:
    """GSM8K-style word problems from reasoning-gym ``gsm_symbolic`` (templated, numeric)."""

    n_train: int
    """Number of training problems."""
    n_valid: int
    """Number of validation problems."""
    n_test: int
    """Number of test problems."""

    def __post_init__(self) -> None:
        check_counts(self.n_train, self.n_valid, self.n_test)


def gsm_record(entry: Mapping[str, Any]) -> Record:
    """One ``gsm`` record from a ``gsm_symbolic`` entry.

    The target is the generator's worked solution (``metadata.answer_cot``) with its final line
    rewritten to ``"#### <answer>"``, because the solution sometimes writes ``36.0`` where the
    answer is ``36``. An entry without a worked solution gets the bare ``"#### <answer>"``.
    """
    answer = entry["answer"]
    steps = [
        line
        for line in str(entry["metadata"].get("answer_cot") or "").strip().splitlines()
        if not line.startswith(GSM_MARKER)
    ]
    return {
        "prompt": entry["question"],
        "target": "\n".join([*steps, f"{GSM_MARKER} {answer}"]),
        "answer": answer,
        "question": entry["question"],
        "entry": json_safe(entry),
    }


def generate_gsm(config: GsmConfig, seed: int) -> Splits:
    """Disjoint, question-deduplicated ``gsm_symbolic`` splits, deterministic for `seed`."""
    budget = attempt_budget(config.n_train + config.n_valid + config.n_test)
    # gsm_symbolic draws its template indices for all `size` items up front, prefix-stably.
    dataset = reasoning_gym().create_dataset(
        "gsm_symbolic", size=budget, seed=derive_seed(seed, "gsm")
    )
    records = (gsm_record(dataset[i]) for i in range(budget))
    counts = split_counts(config.n_train, config.n_valid, config.n_test)
    return assign_unique(records, counts, "gsm")


def score_gsm(answer: str | None, entry: Mapping[str, Any]) -> float:
    """reasoning-gym ``gsm_symbolic``'s own score: 1.0 if the first number equals the answer.

    Note: a wrong number scores 0.01 (not 0), and no number scores 0.0. The checker's regex
    (``\\b-?\\d+``) cannot see a leading minus, so it scores the right answer to the few
    negative-answer problems 0.01; an answer that equals the oracle as a number therefore
    scores 1.0 here before the checker is asked.
    """
    if answer is not None and same_number(answer, str(entry["answer"])):
        return 1.0
    return float(checker("gsm_symbolic").score_answer(answer=answer, entry=dict(entry)))
