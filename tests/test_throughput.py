"""The throughput sweep: batched figures, the batch-1 identity check, config parsing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from setdiff.artifacts import LoadedModel
from setdiff.bench.throughput import Method, parse_config, sweep
from setdiff.config import ConfigError
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")

RECORDS = [
    {"prompt": f"{a}+{b}=", "target": f"{a}+{b}={a + b} #{a + b}", "entry": {"answer": str(a + b)}}
    for a in range(1, 8)
    for b in range(1, 3)
]


def _model(paradigm: str) -> LoadedModel:
    texts = [r[k] for r in RECORDS for k in ("prompt", "target")]
    tokenizer = Tokenizer(train_tokenizer(texts, TokenizerConfig(kind="char", seq_len=16)))
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        n_layer=1,
        n_head=2,
        n_kv_head=1,
        d_model=16,
        d_ff=32,
        max_seq_len=16,
    )
    net = Transformer(config).float().eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(20.0)
    return LoadedModel(net, make_paradigm(paradigm, mask_id=tokenizer.mask_id), tokenizer, Path())


def test_sweep_figures_and_batch1_identity() -> None:
    methods = [
        Method("ar", "default", _model("ar"), {}),
        Method(
            "setdlm", "window=2 threshold=0.5", _model("setdlm"), {"window": 2, "threshold": 0.5}
        ),
        Method("mdlm", "chunk_size=4", _model("mdlm"), {"chunk_size": 4}),
    ]
    figures = sweep(methods, RECORDS, RECORDS[:1], [1, 4, 16], task="arith", seq_len=16)
    assert len(figures) == 9
    by = {(f["paradigm"], f["batch_size"]): f for f in figures}
    for (paradigm, _), f in by.items():
        assert f["n_examples"] == len(RECORDS)
        assert f["identical_to_batch1"] is True
        assert f["accuracy"] == by[(paradigm, 1)]["accuracy"]  # same tokens, same score
        assert f["new_tokens"] == by[(paradigm, 1)]["new_tokens"]
        assert f["tokens_per_second"] > 0 and f["cpu_seconds"] > 0
        assert f["batched_forwards"] <= f["nfe_mean"] * f["n_examples"]
    assert by[("ar", 4)]["speedup_vs_ar"] == 1.0
    # at B = 16 the 14 prompts take one batch: as many forwards as the slowest row
    assert by[("ar", 16)]["batched_forwards"] < by[("ar", 1)]["batched_forwards"]


def test_parse_config() -> None:
    assert parse_config("ar:") == ("ar", "default", {})
    assert parse_config("setdlm:window=2,threshold=0.9") == (
        "setdlm",
        "window=2 threshold=0.9",
        {"window": 2, "threshold": 0.9},
    )
    assert parse_config("aogpt:window=none")[2] == {"window": None}
    with pytest.raises(ConfigError, match="unknown paradigm 'gpt'"):
        parse_config("gpt:window=2")
    with pytest.raises(ConfigError, match="key=value"):
        parse_config("setdlm:window")
