"""The ``arith`` task: multi-term integer addition and subtraction from reasoning-gym ``chain_sum``.

A record is ``{prompt, target, answer, question, entry}`` with a compact prompt ``"5+65-51="`` and
a running-total target ``"5+65=70 70-51=19 #19"``. Scoring calls ``chain_sum``'s own checker on
the stored ``entry``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from setdiff.config import check, frozen
from setdiff.tasks.gym import checker, reasoning_gym
from setdiff.tasks.records import (
    Record,
    Splits,
    assign_unique,
    attempt_budget,
    check_counts,
    derive_seed,
    json_safe,
    split_counts,
)

ARITH_MARKER = "#"
"""Separates the arith running-total steps from the final answer."""


@frozen
class ArithConfig:
    """Multi-term integer addition/subtraction problems from reasoning-gym ``chain_sum``."""

    n_train: int
    """Number of training problems."""
    n_valid: int
    """Number of validation problems."""
    n_test: int
    """Number of test problems."""
    min_terms: int = 2
    """Fewest operands per expression (at least 2, so the target has at least one step)."""
    max_terms: int = 3
    """Most operands per expression."""
    min_digits: int = 1
    """Fewest digits per operand (all operands of one problem share a digit count)."""
    max_digits: int = 2
    """Most digits per operand."""

    def __post_init__(self) -> None:
        check_counts(self.n_train, self.n_valid, self.n_test)
        check(self.min_terms >= 2, f"min_terms must be >= 2, got {self.min_terms}")
        check(self.max_terms >= self.min_terms, "max_terms must be >= min_terms")
        check(self.min_digits >= 1, f"min_digits must be >= 1, got {self.min_digits}")
        check(self.max_digits >= self.min_digits, "max_digits must be >= min_digits")
        total = self.n_train + self.n_valid + self.n_test
        check(
            total <= self.capacity(),
            f"n_train + n_valid + n_test = {total} exceeds the {self.capacity()} distinct "
            "expressions these term/digit ranges allow",
        )

    def capacity(self) -> int:
        """The number of distinct expressions (prompts) the term and digit ranges allow."""
        total = 0
        for digits in range(self.min_digits, self.max_digits + 1):
            # chain_sum draws 1-digit operands from 0..9, d-digit ones from 10**(d-1)..10**d-1.
            values = 10 if digits == 1 else 9 * 10 ** (digits - 1)
            for terms in range(self.min_terms, self.max_terms + 1):
                total += values**terms * 2 ** (terms - 1)
        return total


_ARITH_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub}


def running_total(expression: str) -> tuple[list[str], int]:
    """Left-to-right running-total steps of a ``chain_sum`` expression such as ``"5 + 65 - 51"``.

    Returns:
        The steps (``["5+65=70", "70-51=19"]``) and the final value (19).

    Raises:
        ValueError: on an operator other than ``+``/``-`` or a malformed expression.
    """
    parts = expression.split()
    if len(parts) < 3 or len(parts) % 2 == 0:
        raise ValueError(f"malformed chain_sum expression {expression!r}")
    total = int(parts[0])
    steps = []
    for op, operand in zip(parts[1::2], parts[2::2], strict=True):
        if op not in _ARITH_OPS:
            raise ValueError(f"unsupported operator {op!r} in {expression!r}")
        value = _ARITH_OPS[op](total, int(operand))
        steps.append(f"{total}{op}{operand}={value}")
        total = value
    return steps, total


def arith_record(entry: Mapping[str, Any]) -> Record:
    """One ``arith`` record from a ``chain_sum`` entry (its question/answer/metadata dict)."""
    expression = entry["metadata"]["expression"]
    steps, value = running_total(expression)
    if value != int(entry["answer"]):
        raise ValueError(f"running total {value} disagrees with chain_sum's {entry['answer']!r}")
    return {
        "prompt": expression.replace(" ", "") + "=",
        "target": " ".join(steps) + f" {ARITH_MARKER}{value}",
        "answer": entry["answer"],
        "question": entry["question"],
        "entry": json_safe(entry),
    }


def generate_arith(config: ArithConfig, seed: int) -> Splits:
    """Disjoint, prompt-deduplicated ``chain_sum`` splits, deterministic for `seed`."""
    budget = attempt_budget(config.n_train + config.n_valid + config.n_test)
    dataset = reasoning_gym().create_dataset(
        "chain_sum",
        size=budget,
        seed=derive_seed(seed, "arith"),
        min_terms=config.min_terms,
        max_terms=config.max_terms,
        min_digits=config.min_digits,
        max_digits=config.max_digits,
    )
    records = (arith_record(dataset[i]) for i in range(budget))
    counts = split_counts(config.n_train, config.n_valid, config.n_test)
    return assign_unique(records, counts, "arith")


def score_arith(answer: str | None, entry: Mapping[str, Any]) -> float:
    """reasoning-gym ``chain_sum``'s own score: 1.0 for a numerically equal answer.

    Note its partial credit: an answer that merely contains the oracle string scores
    ``len(oracle) / len(answer)`` (e.g. ``"-13"`` against ``"3"`` scores 1/3).
    """
    return float(checker("chain_sum").score_answer(answer=answer, entry=dict(entry)))
