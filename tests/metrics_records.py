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


def _lossless_figure(accuracy: float, rate: float, reference: str | None, **extra: Any) -> dict:
    return {
        "accuracy": accuracy,
        "tokens_per_second": rate,
        "tokens_per_forward": extra.pop("per_forward", 1.0),
        "draft_acceptance": extra.pop("accepted", None),
        "reference": reference,
        "identical_to_reference": None if reference is None else 60,
        "n": 60,
        "speedup_vs_ar": {"estimate": rate / 600.0, "ci95": [rate / 620.0, rate / 580.0]},
        **extra,
    }


# metrics/lossless/<task>.json as the lossless stage writes it (60 test prompts)
LOSSLESS = {
    "task": "arith",
    "regime": {"batch_size": 1, "threads": 1, "device": "cpu", "parameters": 661632},
    "draft": {"parameters": 44000, "final_eval_loss": 0.52, "seconds": 36.0},
    "selection": {"split": "valid", "n": 100, "draft_tokens": 2, "window": 8},
    "figures": {
        "ar": _lossless_figure(0.95, 600.0, None),
        "ar+draft k=2": _lossless_figure(0.95, 732.0, "ar", per_forward=2.15, accepted=0.7),
        "setdlm W=1": _lossless_figure(0.94, 534.0, None),
        "setdlm verify W=8": _lossless_figure(
            0.94,
            1236.0,
            "setdlm W=1",
            per_forward=2.97,
            accepted=0.63,
            speedup_vs_best={"baseline": "ar+draft k=2", "estimate": 1.69, "ci95": [1.64, 1.74]},
        ),
    },
}
