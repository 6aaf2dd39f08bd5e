"""Training loop: loss goes down for every paradigm; kill + resume = uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from setdiff.batching import ArraySplit
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.train import TrainConfig, evaluate_loss, train

CONFIG = ModelConfig(
    vocab_size=24, n_layer=2, n_head=2, n_kv_head=1, d_model=32, d_ff=64, max_seq_len=32
)


def copy_task(n: int = 128, length: int = 16, seed: int = 0) -> ArraySplit:
    """Targets repeat the 3-token context: learnable by every paradigm in a few steps."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 24, (n, length), generator=g)
    tokens[:, 0] = 1
    for i in range(4, length):
        tokens[:, i] = tokens[:, i - 3]
    lengths = torch.full((n,), length)
    lengths[::4] = length - 3  # some padding
    tokens[::4, length - 3 :] = 0
    return ArraySplit(tokens, torch.full((n,), 4), lengths)


def fresh(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(CONFIG)


@pytest.mark.parametrize("name", list(PARADIGMS))
def test_training_lowers_the_held_out_loss(name: str) -> None:
    split, paradigm = copy_task(), make_paradigm(name, mask_id=3)
    config = TrainConfig(
        steps=150, batch_size=16, lr=3e-3, warmup_steps=5, eval_every=150, eval_examples=64
    )
    net = fresh()
    before = evaluate_loss(net, paradigm, split, config)
    result = train(net, paradigm, split, split, config, show_progress=False)
    assert result.final_eval_loss < 0.8 * before, (before, result.final_eval_loss)


def test_resume_after_a_kill_gives_the_same_weights(tmp_path: Path) -> None:
    split, paradigm = copy_task(), make_paradigm("setdlm", mask_id=3)
    config = TrainConfig(
        steps=30,
        batch_size=8,
        warmup_steps=3,
        eval_every=10,
        checkpoint_every=10,
        ema_decay=0.9,
        eval_examples=16,
    )
    full = train(fresh(), paradigm, split, split, config, show_progress=False)

    class Killed(Exception):
        pass

    def kill_at_20(step: int, loss: float) -> None:
        if step == 20:
            raise Killed

    ckpt = tmp_path / "ckpt"
    with pytest.raises(Killed):  # dies after the step-20 eval, before its checkpoint: resumes at 10
        train(
            fresh(),
            paradigm,
            split,
            split,
            config,
            checkpoint_dir=ckpt,
            on_eval=kill_at_20,
            show_progress=False,
        )
    resumed = train(
        fresh(seed=1), paradigm, split, split, config, checkpoint_dir=ckpt, show_progress=False
    )
    assert resumed.resumed_from == 10
    assert full.weights.keys() == resumed.weights.keys()
    for key in full.weights:
        assert torch.equal(full.weights[key], resumed.weights[key]), key


def test_a_resumed_run_writes_the_same_training_log(tmp_path: Path) -> None:
    """The log travels in the model directory (a DVC output): no wall-clock time in it, so
    retraining or resuming to the same weights leaves the directory's hash unchanged."""
    split, paradigm = copy_task(), make_paradigm("ar", mask_id=3)
    config = TrainConfig(
        steps=20, batch_size=8, warmup_steps=2, eval_every=5, checkpoint_every=5, eval_examples=8
    )
    full = tmp_path / "full.jsonl"
    train(fresh(), paradigm, split, split, config, log_path=full, show_progress=False)

    def kill_at_15(step: int, loss: float) -> None:
        if step == 15:
            raise KeyboardInterrupt

    resumed, ckpt = tmp_path / "resumed.jsonl", tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        train(fresh(), paradigm, split, split, config, checkpoint_dir=ckpt, log_path=resumed,
              on_eval=kill_at_15, show_progress=False)  # fmt: skip
    train(fresh(), paradigm, split, split, config, checkpoint_dir=ckpt, log_path=resumed,
          show_progress=False)  # fmt: skip
    assert resumed.read_bytes() == full.read_bytes()
    assert [json.loads(line)["step"] for line in full.read_text().splitlines()] == [5, 10, 15, 20]


def test_same_seed_same_weights_different_seed_different() -> None:
    split, paradigm = copy_task(), make_paradigm("bd3lm", mask_id=3)
    config = TrainConfig(steps=5, batch_size=8, warmup_steps=1, eval_every=5, eval_examples=8)
    a = train(fresh(), paradigm, split, split, config, show_progress=False).weights
    b = train(fresh(), paradigm, split, split, config, show_progress=False).weights
    c = train(
        fresh(),
        paradigm,
        split,
        split,
        TrainConfig(steps=5, batch_size=8, warmup_steps=1, eval_every=5, eval_examples=8, seed=1),
        show_progress=False,
    ).weights
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize(
    ("field", "value"),
    [("steps", 0), ("batch_size", 0), ("lr", 0.0), ("ema_decay", 1.0), ("min_lr_ratio", 2.0)],
)
def test_bad_train_config_is_rejected(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{"steps": 10, "warmup_steps": 1, field: value})


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    config = TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert config.lr_at(0) == pytest.approx(0.1)
    assert config.lr_at(9) == pytest.approx(1.0)
    assert config.lr_at(10) == pytest.approx(1.0)
    assert config.lr_at(100) == pytest.approx(0.1)
    values = [config.lr_at(s) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_training_noise_sees_the_share_of_steps_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """`train` tells the paradigm how far training is (`progress`, what `MDLMConfig.anneal`
    schedules on): step s of n draws its noise at s / n, and an annealed mdlm trains."""
    from setdiff.paradigm.masked import MDLMConfig

    paradigm = make_paradigm("mdlm", MDLMConfig(causal_prompt=True, anneal=0.5), mask_id=3)
    seen: list[float] = []
    draw = paradigm.training_noise

    def spy(batch, generator=None, *, progress=1.0):  # noqa: ANN001, ANN202
        seen.append(progress)
        return draw(batch, generator, progress=progress)

    monkeypatch.setattr(paradigm, "training_noise", spy)
    config = TrainConfig(steps=4, batch_size=8, lr=3e-3, warmup_steps=1, eval_every=4)
    train(fresh(), paradigm, copy_task(32), copy_task(32), config, show_progress=False)
    assert seen == [0.0, 0.25, 0.5, 0.75]
