"""Training with `compile: true` (torch.compile, inductor on CPU) follows the eager trajectory.

Inductor fuses and reorders float32 arithmetic, so the runs agree to rounding, not bit for bit:
measured here, at most one float32 ulp (2.4e-7) on losses near 3.2 and 3e-7 on the weights after
4 AdamW steps. The tolerances (1e-5 relative on losses, 1e-5 absolute on weights) leave a wide
margin over that and still fail on any real change of the computed function. Compiling this case
from a cold inductor cache takes ~20 s on 2 CPU cores (~3 s warm), hence one layer and 4 steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_distributed import split
from torch._dynamo.utils import counters

from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.train import TrainConfig, TrainResult, train

CONFIG = ModelConfig(
    vocab_size=24, n_layer=1, n_head=2, n_kv_head=1, d_model=32, d_ff=64, max_seq_len=32
)
TRAIN = TrainConfig(
    steps=4, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=4, eval_examples=16, threads=1
)


def run(config: TrainConfig, checkpoint_dir: Path | None = None) -> TrainResult:
    torch.manual_seed(0)
    net, data = Transformer(CONFIG), split()
    paradigm = make_paradigm("setdlm", mask_id=3)
    return train(
        net, paradigm, data, data, config, checkpoint_dir=checkpoint_dir, show_progress=False
    )


@pytest.mark.slow
def test_compiled_training_matches_eager_and_keeps_the_usual_keys(tmp_path: Path) -> None:
    eager = run(TRAIN)
    torch._dynamo.reset()
    counters.clear()
    ckpt = tmp_path / "ckpt"
    compiled = run(dataclasses.replace(TRAIN, compile=True, checkpoint_every=TRAIN.steps), ckpt)
    assert counters["stats"]["unique_graphs"] >= 1  # the training forward did go through dynamo
    assert compiled.train_losses == pytest.approx(eager.train_losses, rel=1e-5)
    assert compiled.final_eval_loss == pytest.approx(eager.final_eval_loss, rel=1e-5)
    assert compiled.weights.keys() == eager.weights.keys()  # no `_orig_mod.` prefix
    for key, value in eager.weights.items():
        assert torch.allclose(compiled.weights[key], value, atol=1e-5), key
    # The checkpoint has the plain keys too: an uncompiled run resumes it (at its last step).
    resumed = run(TRAIN, ckpt)
    assert resumed.resumed_from == TRAIN.steps
    for key, value in compiled.weights.items():
        assert torch.equal(resumed.weights[key], value), key
