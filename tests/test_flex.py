"""FlexAttention training masks (the GPU path) give the same losses as dense SDPA masks on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, Batch, make_paradigm

CONFIG = ModelConfig(
    vocab_size=24, n_layer=2, n_head=2, n_kv_head=1, d_model=32, d_ff=64, max_seq_len=32
)


SHIFTED = [(n, {"shift": True}) for n in ("setdlm", "aogpt", "mdlm")]
ANNEALED = [("mdlm", {"shift": True, "causal_prompt": True, "anneal": 0.5})]


@pytest.mark.parametrize(("name", "overrides"), [(n, {}) for n in PARADIGMS] + SHIFTED + ANNEALED)
def test_flex_and_sdpa_losses_match(name: str, overrides: dict) -> None:
    torch.manual_seed(0)
    net = Transformer(CONFIG).eval()
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        torch.randint(4, 24, (3, 12), generator=g),
        torch.tensor([1, 3, 2]),
        torch.tensor([12, 9, 7]),
    )
    config = PARADIGMS[name][0](**overrides)
    sdpa, flex = (make_paradigm(name, config, mask_id=3, attention=a) for a in ("sdpa", "flex"))
    noise = sdpa.training_noise(batch, g, progress=0.2)  # mid-annealing where annealed
    # FlexAttention has no backward on CPU: the forward is what the GPU path shares with SDPA.
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # eager (uncompiled) flex attention warns on CPU
        a = sdpa.loss(net, batch, noise=noise)
        b = flex.loss(net, batch, noise=noise)
    assert torch.allclose(a.nll_sum, b.nll_sum, atol=1e-4), (a.nll_sum, b.nll_sum)
    assert torch.allclose(a.loss, b.loss, atol=1e-5)


def test_unknown_attention_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="attention"):
        make_paradigm("ar", mask_id=3, attention="flash")


def test_flex_training_on_cpu_is_refused_up_front() -> None:
    from setdiff.train import TrainConfig

    with pytest.raises(ValueError, match="flex"):
        TrainConfig(steps=1, warmup_steps=0, attention="flex", device="cpu")
