"""Multi-rank training on CPU (gloo, 2 processes) follows the single-process trajectory.

DDP and FSDP2 both: same per-step losses, same final (exported) weights; an FSDP checkpoint holds
the full state, so killed runs resume under FSDP or in one process to the same weights."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from setdiff.batching import ArraySplit
from setdiff.distributed import rank_and_world, rekey_optimizer_state
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.train import TrainConfig, TrainResult, train

CONFIG = ModelConfig(
    vocab_size=24, n_layer=2, n_head=2, n_kv_head=1, d_model=32, d_ff=64, max_seq_len=32
)
TRAIN = TrainConfig(
    steps=6, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=6, eval_examples=16, threads=1
)
CLIPPED = dataclasses.replace(TRAIN, grad_clip=0.1, eval_every=3)
"""Well below the tiny model's gradient norms: every step is clipped; training goes on after an
evaluation (a forward without backward, which leaves an FSDP root's parameters gathered)."""
RESUMABLE = dataclasses.replace(CLIPPED, checkpoint_every=3, ema_decay=0.9)
"""Killed at its step-6 eval or stopped at step 3, a run resumes from its step-3 checkpoint
(written right after an evaluation, which swaps the EMA in and out)."""


def split() -> ArraySplit:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 24, (64, 16), generator=g)
    tokens[:, 0] = 1
    lengths = torch.full((64,), 16)
    lengths[::3] = 12
    return ArraySplit(tokens, torch.full((64,), 3), lengths)


def train_run(
    paradigm: str, config: TrainConfig = TRAIN, checkpoint_dir: Path | None = None, **kwargs: Any
) -> TrainResult:
    torch.manual_seed(0)
    net = Transformer(CONFIG)
    data = split()
    return train(
        net,
        make_paradigm(paradigm, mask_id=3),
        data,
        data,
        config,
        checkpoint_dir=checkpoint_dir,
        show_progress=False,
        **kwargs,
    )


def run(paradigm: str, config: TrainConfig = TRAIN) -> dict[str, Any]:
    result = train_run(paradigm, config)
    return {
        "losses": result.train_losses,
        "weights": result.weights,
        "eval": result.final_eval_loss,
    }


class Killed(Exception):
    pass


def kill_at_6(step: int, loss: float) -> None:
    if step == 6:
        raise Killed


def killed_run(checkpoint_dir: Path, config: TrainConfig) -> None:
    """A setdlm run that dies after the step-6 eval, leaving its step-3 checkpoint."""
    with pytest.raises(Killed):
        train_run("setdlm", config, checkpoint_dir, on_eval=kill_at_6)


def resumed_weights(checkpoint_dir: Path, config: TrainConfig) -> dict[str, torch.Tensor]:
    result = train_run("setdlm", config, checkpoint_dir)
    assert result.resumed_from == 3
    return result.weights


def sigterm_rank_1_at_3(step: int, loss: float) -> None:
    if step == 3 and torch.distributed.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGTERM)


def fsdp_resumes(tmp: str) -> dict[str, Any]:
    """Under FSDP: an uninterrupted run; a run that only rank 1 is told to stop (SIGTERM at step
    3: both ranks must checkpoint and stop there), resumed under FSDP after its checkpoint is
    copied aside to `tmp`/fsdp-copy; and a resume of the single-process checkpoint in
    `tmp`/single."""
    config = dataclasses.replace(RESUMABLE, parallel="fsdp")
    full = train_run("setdlm", config).weights
    ckpt = Path(tmp) / "fsdp"
    with pytest.raises(KeyboardInterrupt, match="step 3"):
        train_run("setdlm", config, ckpt, on_eval=sigterm_rank_1_at_3)
    if torch.distributed.get_rank() == 0:
        shutil.copytree(ckpt, Path(tmp) / "fsdp-copy")
    torch.distributed.barrier()
    return {
        "full": full,
        "resumed": resumed_weights(ckpt, config),
        "from_single": resumed_weights(Path(tmp) / "single", config),
    }


def _worker(
    rank: int, world: int, port: int, job: Callable[..., Any], args: tuple[Any, ...], out: str
) -> None:
    torch.distributed.init_process_group(  # a short timeout: a collective mismatch fails fast
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        result = job(*args)
        if rank == 0:
            torch.save(result, out)
    finally:
        torch.distributed.destroy_process_group()


def on_two_ranks(job: Callable[..., Any], *args: Any, out: Path) -> Any:
    """`job(*args)` on 2 gloo ranks; rank 0's return value."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, job, args, str(out)), nprocs=2, join=True)
    return torch.load(out, weights_only=False)


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key].device.type == "cpu" and got[key].dtype == value.dtype, key
        assert torch.allclose(got[key], value, atol=1e-5), key


def assert_same_run(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert len(got["losses"]) == len(want["losses"]) == TRAIN.steps
    diffs = [abs(a - b) for a, b in zip(got["losses"], want["losses"], strict=True)]
    assert max(diffs) < 1e-5, json.dumps(diffs)
    assert got["eval"] == pytest.approx(want["eval"], abs=1e-5)
    assert_same_weights(got["weights"], want["weights"])


@pytest.mark.slow
@pytest.mark.parametrize("paradigm", ["setdlm", "mdlm"])
def test_two_ranks_match_one_process(paradigm: str, tmp_path: Path) -> None:
    ddp = on_two_ranks(run, paradigm, out=tmp_path / "ddp.pt")
    assert_same_run(ddp, run(paradigm))


@pytest.mark.slow
@pytest.mark.parametrize(("paradigm", "ema_decay"), [("setdlm", 0.0), ("mdlm", 0.9)])
def test_fsdp_matches_one_process(paradigm: str, ema_decay: float, tmp_path: Path) -> None:
    config = dataclasses.replace(CLIPPED, ema_decay=ema_decay)
    single = run(paradigm, config)
    unclipped = run(paradigm, dataclasses.replace(config, grad_clip=0.0))
    gaps = [(single["weights"][k] - unclipped["weights"][k]).abs().max() for k in single["weights"]]
    assert max(gaps) > 10 * 1e-5  # clipping changes the weights well beyond the tolerance below
    fsdp = on_two_ranks(
        run, paradigm, dataclasses.replace(config, parallel="fsdp"), out=tmp_path / "fsdp.pt"
    )
    assert_same_run(fsdp, single)


@pytest.mark.slow
def test_fsdp_checkpoints_resume_under_fsdp_and_in_one_process(tmp_path: Path) -> None:
    """Kill + resume under FSDP = uninterrupted FSDP run (bit for bit); and the checkpoints are
    interchangeable: FSDP resumes a single-process one, one process resumes an FSDP one."""
    single = train_run("setdlm", RESUMABLE).weights
    killed_run(tmp_path / "single", RESUMABLE)
    fsdp = on_two_ranks(fsdp_resumes, str(tmp_path), out=tmp_path / "fsdp.pt")
    assert fsdp["full"].keys() == fsdp["resumed"].keys()
    for key, value in fsdp["full"].items():
        assert torch.equal(fsdp["resumed"][key], value), key
    assert_same_weights(fsdp["full"], single)
    assert_same_weights(fsdp["from_single"], single)
    assert_same_weights(resumed_weights(tmp_path / "fsdp-copy", RESUMABLE), single)


@pytest.mark.slow
def test_micro_batches_follow_the_same_trajectory(tmp_path: Path) -> None:
    """Gradient accumulation is the same step: micro-batches of 2 (one process, and 2 DDP ranks
    each accumulating 2 micro-batches of its 4) = whole batches of 8, with clipping active."""
    whole = run("setdlm", CLIPPED)
    micro = dataclasses.replace(CLIPPED, micro_batch_size=2)
    assert_same_run(run("setdlm", micro), whole)
    assert_same_run(on_two_ranks(run, "setdlm", micro, out=tmp_path / "ddp.pt"), whole)


def test_micro_batch_size_must_divide_the_batch() -> None:
    with pytest.raises(ValueError, match="must divide batch_size"):
        dataclasses.replace(TRAIN, micro_batch_size=3)


def test_micro_batches_must_divide_each_ranks_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """batch 8 over 2 ranks = 4 each: micro-batches of 8 fit the config but not a rank; refused
    before any model work."""
    monkeypatch.setattr("setdiff.train.rank_and_world", lambda: (0, 2))
    config = dataclasses.replace(TRAIN, micro_batch_size=8)
    with pytest.raises(ValueError, match="per-rank share 4"):
        train(object(), object(), split(), split(), config)  # type: ignore[arg-type]


def test_one_process_is_rank_0_of_1() -> None:
    assert rank_and_world() == (0, 1)


def test_optimizer_state_rekeys_to_names_and_back() -> None:
    """Checkpoints keep `Optimizer.state_dict()`'s index keys; FSDP's full-state API speaks names:
    the translation is lossless both ways."""
    net = Transformer(CONFIG)
    optimizer = torch.optim.AdamW(net.parameters())
    net(torch.zeros(1, 4, dtype=torch.long), torch.arange(4)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    names = dict(enumerate(name for name, _ in net.named_parameters()))
    by_name = rekey_optimizer_state(state, names)
    assert set(by_name["state"]) <= set(names.values())
    assert by_name["param_groups"][0]["params"] == list(names.values())
    back = rekey_optimizer_state(by_name, {name: i for i, name in names.items()})
    assert back["param_groups"] == state["param_groups"]
    assert back["state"].keys() == state["state"].keys()
    for key, value in state["state"].items():
        assert all(torch.equal(back["state"][key][k], v) for k, v in value.items())
