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


# results/throughput/<task>.json: our batched AR, transformers' and one setdlm configuration
def batched_rows(method: str, paradigm: str, rates: list[float], ar: list[float]) -> list[dict]:
    return [
        {
            "method": method,
            "paradigm": paradigm,
            "batch_size": b,
            "tokens_per_second": r,
            "speedup_vs_ar": r / a,
            "accuracy": 0.9,
            "identical_to_batch1": True,
        }
        for b, r, a in zip((1, 4, 16), rates, ar, strict=True)
    ]


AR_RATES = [100.0, 300.0, 600.0]
HF_RATES = [80.0, 500.0, 900.0]  # transformers' batched AR: slower at B = 1, faster after
BATCHED = (
    batched_rows("ar", "ar", AR_RATES, AR_RATES)
    + batched_rows("ar · transformers", "ar", HF_RATES, AR_RATES)
    + batched_rows("setdlm threshold=0.9 window=4", "setdlm", [200.0, 450.0, 540.0], AR_RATES)
)
# what setdiff.bench.throughput.against_best_ar computes from BATCHED (tests/test_throughput.py)
AGAINST_BEST_AR = {
    "setdlm threshold=0.9 window=4": {
        "ratio_to_best_ar": {"1": 2.0, "4": 0.9, "16": 0.6},
        "best_ar": {"1": "ar", "4": "ar · transformers", "16": "ar · transformers"},
        "crossover": 4,
        "crossover_vs": {"ar": 16, "ar · transformers": 4},
    }
}
