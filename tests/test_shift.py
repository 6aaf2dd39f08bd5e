"""Shifted queries (``shift: true``): brute-force references, AR as a special case, cache and
batch equivalence.

The query predicting position p sits at p - 1 with the token there when it is visible (else
[MASK]) and does not see that position's clean copy; decoded left to right it is AR's own
computation at p - 1, so a model fine-tuned from AR starts where AR is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from setdiff.masks import causal_mask
from setdiff.model import Transformer
from setdiff.orders import identity_order, rank_of
from setdiff.paradigm import (
    AOGPTConfig,
    Batch,
    BD3LMConfig,
    MDLMConfig,
    SetDLMConfig,
    make_paradigm,
)
from setdiff.paradigm.base import _masked_nll
from setdiff.sampling.loop import generate, generate_batch
from setdiff.sampling.policies import decode_policy

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
PROMPTS = {1: [1], 3: [1, 5, 7], 7: [1, 5, 7, 9, 11, 13, 15]}


def _batch(seed: int = 0, B: int = 3, L: int = 10) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 24, (B, L), generator=g)
    tokens[:, 0] = 1
    context = torch.tensor([2, 1, 3][:B])
    length = torch.tensor([L, L - 2, L - 1][:B])
    tokens[torch.arange(L)[None] >= length[:, None]] = 0
    return Batch(tokens, context, length)


def _paradigm(name: str, **kw: Any) -> Any:
    config = {
        "setdlm": SetDLMConfig,
        "aogpt": AOGPTConfig,
        "mdlm": MDLMConfig,
        "bd3lm": BD3LMConfig,
    }[name]
    return make_paradigm(name, config(shift=True, **kw), mask_id=MASK_ID)


@torch.no_grad()
def _reference_nll(net: Transformer, batch: Batch, perm: torch.Tensor) -> torch.Tensor:
    """(B, L) NLL of each rank's target from its own forward: the clean tokens of earlier ranks
    (causal in rank, at their positions), then one query at p - 1 holding x_{p-1} when that
    position is earlier in the order (else [MASK]), which sees every clean token but p - 1's."""
    B, L = batch.tokens.shape
    out = torch.zeros(B, L)
    rank = rank_of(perm)
    for b in range(B):
        x = batch.tokens[b]
        for r in range(L):
            p = int(perm[b, r])
            if not bool(batch.is_target[b, p]):
                continue
            seen = [int(q) for q in perm[b, :r]]
            prev_visible = int(rank[b, p - 1]) < r
            query = int(x[p - 1]) if prev_visible else MASK_ID
            toks = torch.tensor([int(x[q]) for q in seen] + [query])
            pos = torch.tensor(seen + [p - 1])
            n = len(seen)
            mask = torch.ones(n + 1, n + 1, dtype=torch.bool).tril()
            mask[n, :n] = torch.tensor([q != p - 1 for q in seen], dtype=torch.bool)
            logits = net(toks[None], pos[None], mask)[0, -1].double()
            logits[MASK_ID] = float("-inf")
            out[b, r] = -torch.log_softmax(logits, -1)[int(x[p])]
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["setdlm", "aogpt"])
def test_shifted_loss_equals_per_query_forwards(
    make_tiny_model: Callable[..., Transformer], seed: int, name: str
) -> None:
    net = make_tiny_model(seed=seed)
    batch = _batch(seed)
    p = _paradigm(name, set_size=2) if name == "setdlm" else _paradigm(name)
    perm = p.sample_order(batch, torch.Generator().manual_seed(seed))
    out = p.loss_for_order(net, batch, perm)
    ref = _reference_nll(net, batch, perm)
    assert torch.allclose(out.nll_sum, ref.sum(-1), atol=1e-4)


@pytest.mark.parametrize("name", ["setdlm", "aogpt", "bd3lm"])
def test_shifted_identity_order_is_the_ar_loss(
    make_tiny_model: Callable[..., Transformer], name: str
) -> None:
    """Left to right (D = 1, AO-GPT's left-to-right share, BD3LM with S = 1 and every target
    masked) the shifted loss is AR's."""
    net = make_tiny_model(seed=2)
    batch = _batch(2)
    p = {
        "setdlm": lambda: _paradigm("setdlm", set_size=1),
        "aogpt": lambda: _paradigm("aogpt", ltr_share=1.0),
        "bd3lm": lambda: _paradigm("bd3lm", block_size=1, eps=0.0),
    }[name]()
    L = batch.tokens.shape[1]
    with torch.no_grad():
        if name == "bd3lm":  # t = 1 in every block: every target masked, NELBO weight 1
            noise = p.sample_noise(batch)
            noise = {"t": torch.ones_like(noise["t"]), "u": torch.zeros_like(noise["u"])}
            ours = fixed = p.loss(net, batch, noise=noise)
        else:
            ours = p.loss(net, batch, torch.Generator().manual_seed(0))
            fixed = p.loss_for_order(net, batch, identity_order(*batch.tokens.shape))
        # AR's next-token NLL, with the [MASK] logit dropped as every diffusion loss drops it
        logits = net(batch.tokens[:, :-1], torch.arange(L - 1), causal_mask(L - 1))
    theirs = (_masked_nll(logits, batch.tokens[:, 1:], MASK_ID) * batch.is_target[:, 1:]).sum(-1)
    assert torch.allclose(ours.nll_sum, fixed.nll_sum, atol=1e-5)
    assert torch.allclose(ours.nll_sum, theirs, atol=1e-5)


@torch.no_grad()
def _reference_mdlm_nll(
    net: Transformer, p: Any, batch: Batch, noise: dict, causal_prompt: bool
) -> torch.Tensor:
    """(B,) MDLM NELBO of each example from its own forward: full attention over its valid
    positions or, with `causal_prompt`, context position q seeing only positions <= q (a mask
    built by hand); the output at q - shift predicts masked position q."""
    shift = int(p.config.shift)
    masked = batch.is_target & (noise["u"] < (1 - p.config.eps) * noise["t"][:, None])
    xt = torch.where(masked, MASK_ID, batch.tokens)
    ref = torch.zeros(batch.tokens.shape[0])
    for b in range(len(ref)):
        n, c = int(batch.length[b]), int(batch.context_len[b])
        mask = None
        if causal_prompt:
            mask = torch.ones(n, n, dtype=torch.bool)
            for q in range(c):
                mask[q, q + 1 :] = False
        logits = net(xt[b : b + 1, :n], torch.arange(n), mask)[0].double()
        logits[:, MASK_ID] = float("-inf")
        logp = torch.log_softmax(logits, -1)
        for q in masked[b].nonzero().flatten().tolist():
            ref[b] -= logp[q - shift, batch.tokens[b, q]] / noise["t"][b]
    return ref.float()


def test_shifted_mdlm_loss_reads_the_previous_output(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    """Dream's shift: the bidirectional output at p - 1 predicts the masked token at p."""
    net = make_tiny_model(seed=3)
    batch = _batch(3)
    p = _paradigm("mdlm")
    noise = p.sample_noise(batch, torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = p.loss(net, batch, noise=noise)
    assert torch.allclose(out.nll_sum, _reference_mdlm_nll(net, p, batch, noise, False), atol=1e-4)


@pytest.mark.parametrize("shift", [False, True])
def test_causal_prompt_mdlm_loss_matches_a_hand_built_mask(
    make_tiny_model: Callable[..., Transformer], shift: bool
) -> None:
    """``causal_prompt``: context position q sees positions <= q, the rest see every valid
    position; the loss equals per-example forwards under that mask, built by hand."""
    net = make_tiny_model(seed=3)
    batch = _batch(4)
    p = make_paradigm("mdlm", MDLMConfig(shift=shift, causal_prompt=True), mask_id=MASK_ID)
    noise = p.sample_noise(batch, torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = p.loss(net, batch, noise=noise)
    assert torch.allclose(out.nll_sum, _reference_mdlm_nll(net, p, batch, noise, True), atol=1e-4)


@pytest.mark.parametrize("prompt_len", [1, 3, 7])
def test_causal_prompt_mdlm_first_token_is_ar(
    make_tiny_model: Callable[..., Transformer], prompt_len: int
) -> None:
    """Shifted with a causal prompt, the first slot is predicted by AR's own forward at the
    last prompt token (the canvas after it is invisible there): same first token and logits."""
    net = make_tiny_model(seed=0, head_scale=20.0)
    prompt = PROMPTS[prompt_len]
    paradigm = make_paradigm("mdlm", MDLMConfig(shift=True, causal_prompt=True), mask_id=MASK_ID)
    ours = generate(
        net, prompt, max_new_tokens=6, paradigm=paradigm, chunk_size=1, trace_logits=True
    )
    ar = generate(
        net,
        prompt,
        max_new_tokens=6,
        paradigm=make_paradigm("ar", mask_id=MASK_ID),
        trace_logits=True,
    )
    assert ours.steps[0] == [prompt_len]
    assert ours.tokens[0] == ar.tokens[0]
    # mdlm's first forward: the query row predicting slot prompt_len is fed at prompt_len - 1
    first = ours.logits[0][prompt_len - 1]
    assert (first - ar.logits[0][-1]).abs().max().item() <= 1e-4


@pytest.fixture
def sharp_model(make_tiny_model: Callable[..., Transformer]) -> Transformer:
    return make_tiny_model(seed=0, head_scale=20.0)


@pytest.mark.parametrize("prompt_len", [1, 3, 7])
@pytest.mark.parametrize("name", ["setdlm", "bd3lm"])
def test_shifted_decodes_as_ar_left_to_right(
    sharp_model: Transformer, prompt_len: int, name: str
) -> None:
    """setdlm at W = 1 and bd3lm at S = 1, threshold off: every query is AR's forward at p - 1
    (same tokens, same logits)."""
    prompt = PROMPTS[prompt_len]
    paradigm, kw = (
        (_paradigm("setdlm", set_size=2), {"window": 1})
        if name == "setdlm"
        else (_paradigm("bd3lm", block_size=1), {})
    )
    ar = generate(
        sharp_model, prompt, max_new_tokens=10, paradigm=make_paradigm("ar", mask_id=MASK_ID)
    )
    ours = generate(
        sharp_model, prompt, max_new_tokens=10, paradigm=paradigm, trace_logits=True, **kw
    )
    assert ours.tokens == ar.tokens
    ar_trace = generate(
        sharp_model,
        prompt,
        max_new_tokens=10,
        paradigm=make_paradigm("ar", mask_id=MASK_ID),
        trace_logits=True,
    )
    # AR's forward k predicts new token k from its last row; ours from its query row (our
    # first forward prefills the prompt and queries the first slot, as AR's does).
    assert ours.nfe == ar_trace.nfe
    for la, lb in zip(ar_trace.logits, ours.logits, strict=True):
        assert (la[-1] - lb[-1]).abs().max().item() <= 1e-4


def _both(net: Any, paradigm: Any, prompt: list[int], n: int, **kw: Any) -> Any:
    a = generate(net, prompt, max_new_tokens=n, paradigm=paradigm, trace_logits=True, **kw)
    b = generate(
        net, prompt, max_new_tokens=n, paradigm=paradigm, use_cache=False, trace_logits=True, **kw
    )
    assert a.tokens == b.tokens and a.steps == b.steps and a.nfe == b.nfe
    for la, lb in zip(a.logits, b.logits, strict=True):
        assert (la - lb).abs().max().item() <= 1e-5
    return a


CASES = [
    ("setdlm", {"window": 1}),
    ("setdlm", {"window": 4}),
    ("setdlm", {"window": 4, "threshold": 0.05}),
    ("setdlm", {"window": "all", "threshold": 0.5}),
    ("aogpt", {"order": "confidence", "window": 4}),
    ("aogpt", {"order": "random"}),
    ("mdlm", {"chunk_size": 4, "threshold": 0.05}),
    ("mdlm", {"chunk_size": 32}),
    ("bd3lm", {}),
    ("bd3lm", {"threshold": 0.05}),
]


@pytest.mark.parametrize(("name", "kw"), CASES)
@pytest.mark.parametrize("prompt_len", [1, 3])
def test_shifted_cache_equivalence(
    sharp_model: Transformer, name: str, kw: dict, prompt_len: int
) -> None:
    res = _both(sharp_model, _paradigm(name), PROMPTS[prompt_len], 10, **kw)
    assert len(res.tokens) == 10 and MASK_ID not in res.tokens


@pytest.mark.parametrize("name", ["setdlm", "aogpt", "mdlm"])
def test_shifted_infilling_cache_equivalence(sharp_model: Transformer, name: str) -> None:
    kw = {"setdlm": {"window": 2, "threshold": 0.5}, "aogpt": {}, "mdlm": {"chunk_size": 4}}[name]
    res = _both(sharp_model, _paradigm(name), PROMPTS[3], 6, suffix_ids=[9, 10, 11], **kw)
    assert sorted(p for step in res.steps for p in step) == list(range(3, 9))


def test_shift_changes_the_decode(sharp_model: Transformer) -> None:
    """The flag reaches the sampler: the same weights decode differently with and without."""
    plain = make_paradigm("setdlm", SetDLMConfig(), mask_id=MASK_ID)
    a = generate(sharp_model, PROMPTS[3], max_new_tokens=10, paradigm=plain, window=4)
    b = generate(sharp_model, PROMPTS[3], max_new_tokens=10, paradigm=_paradigm("setdlm"))
    assert a.tokens != b.tokens


@pytest.mark.parametrize(("name", "kw"), CASES)
def test_shifted_batch_rows_equal_alone(sharp_model: Transformer, name: str, kw: dict) -> None:
    paradigm = _paradigm(name)
    prompts = [PROMPTS[3], PROMPTS[1], PROMPTS[7]]
    rows = generate_batch(sharp_model, prompts, max_new_tokens=[8, 10, 6], paradigm=paradigm, **kw)
    for prompt, n, row in zip(prompts, [8, 10, 6], rows, strict=True):
        alone = generate(sharp_model, prompt, max_new_tokens=n, paradigm=paradigm, **kw)
        assert row.tokens == alone.tokens and row.steps == alone.steps and row.nfe == alone.nfe


def test_shift_survives_save_and_load(tmp_path: Any, tiny_model: Transformer) -> None:
    from setdiff.artifacts import load_model, save_model_dir

    paradigm = _paradigm("setdlm", set_size=2)
    save_model_dir(tmp_path / "m", tiny_model, paradigm)
    loaded = load_model(tmp_path / "m")
    assert loaded.paradigm.config.shift is True
    assert decode_policy(loaded.paradigm, {}).shift is True
