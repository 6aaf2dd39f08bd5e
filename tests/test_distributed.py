"""Data-parallel training on CPU (gloo, 2 processes) follows the single-process trajectory."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from setdiff.batching import ArraySplit
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.train import TrainConfig, train

CONFIG = ModelConfig(vocab_size=24, n_layer=2, n_head=2, n_kv_head=1, d_model=32, d_ff=64,
                     max_seq_len=32)
TRAIN = TrainConfig(steps=6, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=6,
                    eval_examples=16, threads=1)


def split() -> ArraySplit:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 24, (64, 16), generator=g)
    tokens[:, 0] = 1
    lengths = torch.full((64,), 16)
    lengths[::3] = 12
    return ArraySplit(tokens, torch.full((64,), 3), lengths)


def run(paradigm: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    net = Transformer(CONFIG)
    data = split()
    result = train(net, make_paradigm(paradigm, mask_id=3), data, data, TRAIN, show_progress=False)
    return result.train_losses, result.weights


def _worker(rank: int, world: int, port: int, paradigm: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=world)
    try:
        losses, weights = run(paradigm)
        if rank == 0:
            torch.save({"losses": losses, "weights": weights}, out)
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("paradigm", ["setdlm", "mdlm"])
def test_two_ranks_match_one_process(paradigm: str, tmp_path: Path) -> None:
    single_losses, single_weights = run(paradigm)
    out = tmp_path / "ddp.pt"
    mp.spawn(_worker, args=(2, free_port(), paradigm, str(out)), nprocs=2, join=True)
    ddp = torch.load(out, weights_only=False)
    assert len(ddp["losses"]) == len(single_losses) == TRAIN.steps
    diffs = [abs(a - b) for a, b in zip(ddp["losses"], single_losses, strict=True)]
    assert max(diffs) < 1e-5, json.dumps(diffs)
    for key, value in single_weights.items():
        assert torch.allclose(ddp["weights"][key], value, atol=1e-5), key
