"""Shared fixtures: tiny float32 backbones for fast CPU tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from setdiff.model import ModelConfig, Transformer

MASK_ID = 3


def tiny_config(**overrides: object) -> ModelConfig:
    kwargs: dict[str, object] = dict(
        vocab_size=24, n_layer=2, n_head=2, n_kv_head=1, d_model=32, d_ff=64, max_seq_len=128
    )
    kwargs.update(overrides)
    return ModelConfig(**kwargs)  # type: ignore[arg-type]


def build_tiny_model(seed: int = 0, head_scale: float = 1.0, **overrides: object) -> Transformer:
    """A seeded tiny Transformer in eval mode; `head_scale` multiplies the lm_head weights
    (random tiny models are nearly uniform; a large scale spreads the confidences out)."""
    torch.manual_seed(seed)
    net = Transformer(tiny_config(**overrides)).float().eval()
    if head_scale != 1.0:
        with torch.no_grad():
            net.lm_head.weight.mul_(head_scale)
    return net


@pytest.fixture
def make_tiny_model() -> Callable[..., Transformer]:
    return build_tiny_model


@pytest.fixture
def tiny_model() -> Transformer:
    return build_tiny_model(seed=0)


@pytest.fixture
def mask_id() -> int:
    return MASK_ID


@pytest.fixture(autouse=True)
def single_thread() -> object:
    """Run every test on one intra-op thread (restored afterwards); `pytest -n 2` uses the cores.

    With 2 cores shared by other processes, OpenMP thread hand-offs on microsecond-sized ops
    stall for up to ~250 ms per forward; one thread is both faster and steadier here.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
