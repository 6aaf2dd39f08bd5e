"""Metrics files as the stages write them (every field `metrics_schema` requires), for tests that
build a run by hand."""

from __future__ import annotations

from typing import Any


def evaluate_metrics(task: str, paradigm: str, accuracy: float) -> dict[str, Any]:
    """metrics/evaluate/<task>/<paradigm>.json of an answer task."""
    return {
        "task": task,
        "paradigm": paradigm,
        "nll_per_token": 0.4,
        "ppl": 1.5,
        "n_tokens": 1000,
        "n_sequences": 10,
        "likelihood_is_exact": paradigm == "ar",
        "accuracy": accuracy,
        "score": accuracy,
        "n_answers": 500,
    }


def train_metrics(task: str, paradigm: str, steps: int) -> dict[str, Any]:
    """metrics/train/<task>/<paradigm>.json."""
    return {
        "task": task,
        "paradigm": paradigm,
        "steps": steps,
        "final_train_loss": 0.1,
        "final_eval_loss": 0.1,
        "seconds": 60.0,
        "parameters": 1000,
    }
