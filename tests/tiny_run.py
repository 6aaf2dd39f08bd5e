"""The smallest arith run a stage test can prepare, tokenize and train in seconds: params
sections every such test shares (each test adds its own stage's section)."""

from __future__ import annotations

from typing import Any

RECIPE = {"steps": 3, "batch_size": 8, "warmup_steps": 1, "eval_every": 3, "eval_examples": 8}


def tiny_params(**sections: Any) -> dict[str, Any]:
    """data, tokenizer, model and train for arith (ar + setdlm), plus `sections`."""
    return {
        "data": {"seed": 0, "arith": {"n_train": 40, "n_valid": 10, "n_test": 10}},
        "tokenizer": {"arith": {"kind": "char", "seq_len": 32}},
        "model": {"arith": {"n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 32, "d_ff": 64}},
        "train": {"arith": {"ar": dict(RECIPE), "diffusion": dict(RECIPE)}},
        "paradigm": {"ar": {}, "setdlm": {"set_size": 2}},
        "decode": {"ar": {}, "setdlm": {"window": 2}},
        **sections,
    }
