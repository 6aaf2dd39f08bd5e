"""Backbone options (biases, LayerNorm/GELU, learned positions, more heads) and the
length-aware paradigm options (padding as targets, AR context loss, AO-GPT frontier window),
each held to the same brute-force references as the default backbone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_kv_cache import PROMPTS, run_both
from test_losses import MASK_ID, PAD_ID, L, make_batch, orders_for, ref_set_nll

from setdiff.model import Transformer
from setdiff.paradigm import AOGPTConfig, ARConfig, MDLMConfig, make_paradigm
from setdiff.sampling.loop import generate

pytestmark = pytest.mark.usefixtures("single_thread")

BACKBONES: dict[str, dict[str, Any]] = {
    "biases": {"attention_bias": True, "mlp_bias": True},
    "layernorm-gelu": {"norm": "layer", "mlp": "gelu", "attention_bias": True, "mlp_bias": True},
    "learned-positions": {"learned_positions": True},
    "4-heads": {"n_head": 4, "n_kv_head": 4},
}


def _randomise_biases(net: Transformer) -> Transformer:
    """Biases and position rows start at zero / tiny: make them count in the references."""
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("bias") or "embed_positions" in name:
                p.copy_(0.3 * torch.randn_like(p))
    return net


@pytest.fixture(params=list(BACKBONES), ids=list(BACKBONES))
def backbone(request: pytest.FixtureRequest, make_tiny_model: Callable[..., Transformer]) -> Any:
    def build(seed: int = 0, head_scale: float = 1.0) -> Transformer:
        net = make_tiny_model(seed=seed, head_scale=head_scale, **BACKBONES[request.param])
        return _randomise_biases(net)

    return build


@pytest.mark.parametrize("kind", ["identity", "staggered", "uniform"])
def test_set_loss_equals_per_rank_forwards(backbone: Any, kind: str) -> None:
    net, batch = backbone(seed=1), make_batch(1)
    perm = orders_for(batch, kind, 1)
    with torch.no_grad():
        out = make_paradigm("setdlm", mask_id=MASK_ID).loss_for_order(net, batch, perm)
    assert (out.nll_sum.double() - ref_set_nll(net, batch, perm)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name, options", [("setdlm", {"window": 2}), ("ar", {})])
def test_cached_equals_uncached(backbone: Any, name: str, options: dict) -> None:
    run_both(backbone(seed=2, head_scale=20.0), name, PROMPTS[3], 10, **options)


def test_bias_options_add_parameters(make_tiny_model: Callable[..., Transformer]) -> None:
    names = {n for n, _ in make_tiny_model(**BACKBONES["biases"]).named_parameters()}
    assert "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.0.mlp.down_proj.bias" in names
    gelu = {n for n, _ in make_tiny_model(**BACKBONES["layernorm-gelu"]).named_parameters()}
    assert "model.layers.0.mlp.gate_proj.weight" not in gelu
    assert "model.layers.0.input_layernorm.bias" in gelu


# ---------------------------------------------------------------------------------------------
# padding as targets (mdlm, aogpt)


def test_aogpt_padding_targets_are_permuted_and_scored(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    """With pad_targets the padding joins the targets: orders permute it with the answer, and
    the loss equals the per-rank reference over the full rows, reported per real target."""
    net, batch = make_tiny_model(seed=5), make_batch(5)
    paradigm = make_paradigm("aogpt", AOGPTConfig(pad_targets=True), mask_id=MASK_ID)
    perm = paradigm.sample_order(batch, torch.Generator().manual_seed(0))
    full = batch.with_padding_as_target()
    for b in range(batch.tokens.shape[0]):
        c = int(batch.context_len[b])
        assert perm[b, :c].tolist() == list(range(c))
        assert sorted(perm[b, c:].tolist()) == list(range(c, L))
    with torch.no_grad():
        out = paradigm.loss_for_order(net, batch, perm)
    assert (out.nll_sum.double() - ref_set_nll(net, full, perm)).abs().max().item() <= 1e-5
    assert torch.equal(out.n_tokens, batch.is_target.sum(-1))
    assert full.is_target.sum() > batch.is_target.sum()  # the fixture has padded rows


def test_mdlm_padding_targets_are_masked_and_visible(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    net, batch = make_tiny_model(seed=6), make_batch(6)
    calls: list[tuple] = []

    def spy(tokens: torch.Tensor, positions: torch.Tensor, mask: Any) -> torch.Tensor:
        calls.append((tokens, mask))
        return net(tokens, positions, mask)

    paradigm = make_paradigm("mdlm", MDLMConfig(pad_targets=True), mask_id=MASK_ID)
    noise = paradigm.sample_noise(batch, torch.Generator().manual_seed(0))
    noise["t"] = torch.ones(5)  # everything masked
    with torch.no_grad():
        out = paradigm.loss(spy, batch, noise=noise)
    ((xt, mask),) = calls
    assert bool((xt[~batch.is_context] == MASK_ID).all())  # padding masked too
    assert mask is None or bool(mask.all())  # padded keys are visible
    logits = net(xt, torch.arange(L), None).double()
    logits[..., MASK_ID] = float("-inf")
    nll = F.cross_entropy(logits.transpose(1, 2), batch.tokens, reduction="none")
    ref = (nll * (~batch.is_context)).sum(-1)
    assert (out.nll_sum.double() - ref).abs().max().item() <= 1e-4
    assert torch.equal(out.n_tokens, batch.is_target.sum(-1))
    assert bool((batch.tokens[~batch.valid] == PAD_ID).all())


def test_ar_context_loss_trains_on_prompts_and_reports_targets(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    net, batch = make_tiny_model(seed=7), make_batch(7)
    plain = make_paradigm("ar", mask_id=MASK_ID)
    full = make_paradigm("ar", ARConfig(context_loss=True), mask_id=MASK_ID)
    with torch.no_grad():
        a, b = plain.loss(net, batch), full.loss(net, batch)
        logits = net(
            batch.tokens[:, :-1], torch.arange(L - 1), torch.ones(L - 1, L - 1).tril().bool()
        )
    assert torch.equal(a.nll_sum, b.nll_sum) and torch.equal(a.n_tokens, b.n_tokens)
    nll = F.cross_entropy(logits.transpose(1, 2), batch.tokens[:, 1:], reduction="none")
    trained = batch.valid[:, 1:].float()
    ref = ((nll * trained).sum(-1) / trained.sum(-1)).mean()
    assert b.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert b.loss.item() != pytest.approx(a.loss.item(), abs=1e-4)


# ---------------------------------------------------------------------------------------------
# AO-GPT frontier window


@pytest.mark.parametrize("window", [1, 3])
def test_aogpt_window_decodes_near_the_frontier(
    make_tiny_model: Callable[..., Transformer], window: int
) -> None:
    net = make_tiny_model(seed=8, head_scale=20.0)
    paradigm = make_paradigm("aogpt", mask_id=MASK_ID)
    res = generate(
        net, [1, 5], max_new_tokens=12, paradigm=paradigm, order="confidence", window=window
    )
    decoded: set[int] = set()
    for (pos,) in res.steps:
        frontier = min(set(range(2, 14)) - decoded)
        assert frontier <= pos < frontier + window
        decoded.add(pos)
    if window == 1:
        assert [s[0] for s in res.steps] == list(range(2, 14))
    run_both(net, "aogpt", PROMPTS[3], 10, order="confidence", window=window)
