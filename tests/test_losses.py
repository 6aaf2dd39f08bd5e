"""Training losses against one-forward-per-target references (spec 3, 10).

The set-diffusion / AO-GPT reference feeds, for every target rank r, only the clean tokens of
ranks < r (causal) plus one [MASK] query at position perm[r] that sees all of them: the
any-order-AR factorization the two-copy trick must reproduce in one forward.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from setdiff.model import Transformer
from setdiff.orders import order_from_times, sample_uniform_times
from setdiff.paradigm import (
    AOGPTConfig,
    Batch,
    BD3LMConfig,
    MDLMConfig,
    SetDLMConfig,
    make_paradigm,
)

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
PAD_ID = 0
L = 10


def make_batch(seed: int = 0, pad_id: int = PAD_ID) -> Batch:
    """Rows with context > 1, padding, no context, and both."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 24, (5, L), generator=g)
    context_len = torch.tensor([1, 3, 0, 4, 2])
    length = torch.tensor([L, 7, L, 6, 9])
    pos = torch.arange(L)
    tokens = torch.where(pos[None] < length[:, None], tokens, torch.full_like(tokens, pad_id))
    return Batch(tokens=tokens, context_len=context_len, length=length)


def causal(n: int) -> torch.Tensor:
    return torch.tensor([[k <= q for k in range(n)] for q in range(n)], dtype=torch.bool)


@torch.no_grad()
def ref_set_nll(net: Transformer, batch: Batch, perm: torch.Tensor) -> torch.Tensor:
    """Per-sequence NLL sums, one forward per target rank."""
    out = []
    for b in range(batch.tokens.shape[0]):
        toks = batch.tokens[b].tolist()
        ctx, n = int(batch.context_len[b]), int(batch.length[b])
        order = perm[b].tolist()
        total = 0.0
        for r, p in enumerate(order):
            if not ctx <= p < n:
                continue  # not a target
            prefix = order[:r]
            inp = torch.tensor([toks[q] for q in prefix] + [MASK_ID])
            positions = torch.tensor(prefix + [p])
            mask = torch.zeros(r + 1, r + 1, dtype=torch.bool)
            mask[:r, :r] = causal(r)  # clean prefix: causal over the order
            mask[r, :] = True  # the query sees every earlier clean token and itself
            logits = net(inp[None], positions[None], mask)[0, -1].double()
            logits[MASK_ID] = float("-inf")
            total += -torch.log_softmax(logits, -1)[toks[p]].item()
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


@torch.no_grad()
def ref_ar_nll(net: Transformer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy, one forward per target position (full vocabulary)."""
    sums, counts = [], []
    for b in range(batch.tokens.shape[0]):
        toks = batch.tokens[b]
        ctx, n = int(batch.context_len[b]), int(batch.length[b])
        total, count = 0.0, 0
        for i in range(max(ctx, 1), n):
            logits = net(toks[None, :i], torch.arange(i)[None], causal(i))[0, -1].double()
            total += -torch.log_softmax(logits, -1)[toks[i]].item()
            count += 1
        sums.append(total)
        counts.append(count)
    return torch.tensor(sums, dtype=torch.float64), torch.tensor(counts)


def orders_for(batch: Batch, kind: str, seed: int) -> torch.Tensor:
    B = batch.tokens.shape[0]
    g = torch.Generator().manual_seed(seed)
    if kind == "identity":
        return torch.arange(L).expand(B, L).clone()
    if kind == "uniform":
        times = sample_uniform_times(B, L, generator=g)
    else:
        times = (
            make_paradigm("setdlm", SetDLMConfig(set_size=2), mask_id=MASK_ID)
            .config.schedule(L)
            .sample_times(B, g)
        )
    return order_from_times(times, batch.is_context, batch.valid)


def n_targets(batch: Batch) -> torch.Tensor:
    return torch.tensor(
        [max(0, int(n) - int(c)) for c, n in zip(batch.context_len, batch.length, strict=True)]
    )


# ---------------------------------------------------------------------------------------------
# set diffusion / AO-GPT: two-copy forward == L separate forwards


@pytest.mark.parametrize("name", ["setdlm", "aogpt"])
@pytest.mark.parametrize("kind", ["identity", "uniform", "staggered"])
@pytest.mark.parametrize("seed", [0, 1])
def test_set_loss_equals_per_rank_forwards(
    make_tiny_model: Callable[..., Transformer], name: str, kind: str, seed: int
) -> None:
    net = make_tiny_model(seed=seed)
    batch = make_batch(seed)
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    perm = orders_for(batch, kind, seed)
    with torch.no_grad():
        out = paradigm.loss_for_order(net, batch, perm)
    ref = ref_set_nll(net, batch, perm)
    assert torch.equal(out.n_tokens, n_targets(batch))
    assert (out.nll_sum.double() - ref).abs().max().item() <= 1e-5
    per_seq = ref / n_targets(batch).double()
    assert out.loss.item() == pytest.approx(per_seq.mean().item(), abs=1e-6)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("setdlm", SetDLMConfig(set_size=2)),
        ("setdlm", SetDLMConfig(set_size=L)),
        ("aogpt", AOGPTConfig()),
        ("aogpt", AOGPTConfig(ltr_share=0.5)),
    ],
)
def test_sampled_loss_uses_a_valid_order(
    make_tiny_model: Callable[..., Transformer], name: str, config: object
) -> None:
    net = make_tiny_model(seed=3)
    batch = make_batch(3)
    paradigm = make_paradigm(name, config, mask_id=MASK_ID)
    perm = paradigm.sample_order(batch, torch.Generator().manual_seed(5))
    for b in range(batch.tokens.shape[0]):
        c, n = int(batch.context_len[b]), int(batch.length[b])
        row = perm[b].tolist()
        assert row[:c] == list(range(c)) and row[n:] == list(range(n, L))
        assert sorted(row) == list(range(L))
    with torch.no_grad():
        out = paradigm.loss(net, batch, torch.Generator().manual_seed(5))
    ref = ref_set_nll(net, batch, perm)
    assert (out.nll_sum.double() - ref).abs().max().item() <= 1e-5


def test_setdlm_d1_is_ar_over_positions(make_tiny_model: Callable[..., Transformer]) -> None:
    """D = 1: the sampled order is the identity, so the loss is sum_i -log p(x_i | x_<i)."""
    net = make_tiny_model(seed=4)
    batch = make_batch(4)
    paradigm = make_paradigm("setdlm", SetDLMConfig(set_size=1), mask_id=MASK_ID)
    with torch.no_grad():
        out = paradigm.loss(net, batch, torch.Generator().manual_seed(0))
    ref = ref_set_nll(net, batch, torch.arange(L).expand(5, L))
    assert (out.nll_sum.double() - ref).abs().max().item() <= 1e-5


def test_set_loss_label_is_not_visible(make_tiny_model: Callable[..., Transformer]) -> None:
    """Changing a target token must not change the prediction made *for* it (no label leak):
    only its own NLL term and those of later ranks can change."""
    net = make_tiny_model(seed=5)
    batch = make_batch(5)
    paradigm = make_paradigm("aogpt", mask_id=MASK_ID)
    perm = orders_for(batch, "uniform", 5)
    b = 0
    last_pos = int(perm[b, L - 1])  # the last-ranked target of a row without padding
    tokens2 = batch.tokens.clone()
    tokens2[b, last_pos] = 4 if int(tokens2[b, last_pos]) != 4 else 5
    batch2 = Batch(tokens2, batch.context_len, batch.length)
    with torch.no_grad():
        x0 = batch.tokens.gather(1, perm)
        logits = net(
            torch.cat((x0, torch.where(batch.is_target.gather(1, perm), MASK_ID, x0)), 1),
            torch.cat((perm, perm), 1),
            _ref_two_copy_mask(L),
        )
        x0b = batch2.tokens.gather(1, perm)
        logits2 = net(
            torch.cat((x0b, torch.where(batch2.is_target.gather(1, perm), MASK_ID, x0b)), 1),
            torch.cat((perm, perm), 1),
            _ref_two_copy_mask(L),
        )
    # every noisy query of row b is unchanged (the changed token is only seen by later ranks)
    assert torch.allclose(logits[b, L:], logits2[b, L:], atol=1e-6)
    with torch.no_grad():
        d = (
            paradigm.loss_for_order(net, batch2, perm).nll_sum
            - paradigm.loss_for_order(net, batch, perm).nll_sum
        )
    assert d[1:].abs().max() <= 1e-6 and d[0].abs() > 1e-3


def _ref_two_copy_mask(n: int) -> torch.Tensor:
    m = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    m[:n, :n] = causal(n)
    m[n:, :n] = torch.ones(n, n, dtype=torch.bool).tril(-1)
    m[n:, n:] = torch.eye(n, dtype=torch.bool)
    return m


# ---------------------------------------------------------------------------------------------
# AR


def test_ar_loss_is_next_token_cross_entropy(make_tiny_model: Callable[..., Transformer]) -> None:
    net = make_tiny_model(seed=6)
    batch = make_batch(6)
    with torch.no_grad():
        out = make_paradigm("ar", mask_id=MASK_ID).loss(net, batch)
    ref, counts = ref_ar_nll(net, batch)
    assert torch.equal(out.n_tokens.long(), counts)
    assert (out.nll_sum.double() - ref).abs().max().item() <= 1e-5
    assert out.loss.item() == pytest.approx((ref / counts).mean().item(), abs=1e-6)


# ---------------------------------------------------------------------------------------------
# all paradigms: finiteness, gradients, padding, mask logit, normalization

ALL = ["ar", "mdlm", "bd3lm", "aogpt", "setdlm"]


@pytest.mark.parametrize("name", ALL)
def test_loss_finite_positive_with_gradients(
    make_tiny_model: Callable[..., Transformer], name: str
) -> None:
    net = make_tiny_model(seed=7).train()
    batch = make_batch(7)
    out = make_paradigm(name, mask_id=MASK_ID).loss(net, batch, torch.Generator().manual_seed(1))
    assert out.loss.dim() == 0 and torch.isfinite(out.loss) and out.loss.item() > 0
    assert torch.isfinite(out.nll_sum).all() and (out.nll_sum >= 0).all()
    out.loss.backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("name", ALL)
def test_loss_is_seeded(make_tiny_model: Callable[..., Transformer], name: str) -> None:
    net = make_tiny_model(seed=8)
    batch = make_batch(8)
    p = make_paradigm(name, mask_id=MASK_ID)
    with torch.no_grad():
        a = p.loss(net, batch, torch.Generator().manual_seed(3))
        b = p.loss(net, batch, torch.Generator().manual_seed(3))
    assert torch.equal(a.nll_sum, b.nll_sum)


@pytest.mark.parametrize("name", ALL)
def test_padding_content_is_ignored(make_tiny_model: Callable[..., Transformer], name: str) -> None:
    net = make_tiny_model(seed=9)
    p = make_paradigm(name, mask_id=MASK_ID)
    with torch.no_grad():
        a = p.loss(net, make_batch(9, pad_id=0), torch.Generator().manual_seed(2))
        b = p.loss(net, make_batch(9, pad_id=17), torch.Generator().manual_seed(2))
    assert torch.allclose(a.nll_sum, b.nll_sum, atol=1e-5)


class BoostMaskLogit(nn.Module):
    """Adds a huge constant to the [MASK] logit: a loss that excludes it must not change."""

    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, tokens, positions, mask=None, cache=None):  # noqa: ANN001, ANN201
        logits = self.inner(tokens, positions, mask, cache).clone()
        logits[..., MASK_ID] += 1e4
        return logits


@pytest.mark.parametrize("name", ["mdlm", "bd3lm", "aogpt", "setdlm"])
def test_mask_logit_gets_no_probability(
    make_tiny_model: Callable[..., Transformer], name: str
) -> None:
    net = make_tiny_model(seed=10)
    batch = make_batch(10)
    p = make_paradigm(name, mask_id=MASK_ID)
    with torch.no_grad():
        a = p.loss(net, batch, torch.Generator().manual_seed(4))
        b = p.loss(BoostMaskLogit(net), batch, torch.Generator().manual_seed(4))
    assert torch.allclose(a.nll_sum, b.nll_sum, atol=1e-4)


@pytest.mark.parametrize("name", ALL)
def test_rows_without_targets_are_excluded(
    make_tiny_model: Callable[..., Transformer], name: str
) -> None:
    net = make_tiny_model(seed=11)
    batch = make_batch(11)
    # row 1: context covers the whole sequence -> no targets
    batch0 = Batch(batch.tokens, torch.tensor([1, 7, 0, 4, 2]), batch.length)
    p = make_paradigm(name, mask_id=MASK_ID)
    with torch.no_grad():
        out = p.loss(net, batch0, torch.Generator().manual_seed(6))
    assert int(out.n_tokens[1]) == 0 and float(out.nll_sum[1]) == 0.0
    assert torch.isfinite(out.loss)
    if name in ("ar", "setdlm", "aogpt"):
        # per-sequence mean over its targets, then a mean over sequences that have targets
        keep = torch.tensor([0, 2, 3, 4])
        expected = (out.nll_sum[keep] / out.n_tokens[keep].float()).mean()
        assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_all_rows_without_targets_give_zero_loss(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    net = make_tiny_model(seed=11)
    batch = make_batch(11)
    empty = Batch(batch.tokens, batch.length.clone(), batch.length)
    for name in ALL:
        with torch.no_grad():
            out = make_paradigm(name, mask_id=MASK_ID).loss(
                net, empty, torch.Generator().manual_seed(0)
            )
        assert out.loss.item() == 0.0 and (out.n_tokens == 0).all(), name


# ---------------------------------------------------------------------------------------------
# MDLM / BD3LM inputs: what is masked, what attends to what


class Spy(nn.Module):
    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    def forward(self, tokens, positions, mask=None, cache=None):  # noqa: ANN001, ANN201
        self.calls.append(
            (tokens.clone(), positions.clone(), None if mask is None else mask.clone())
        )
        return self.inner(tokens, positions, mask, cache)


def _per_token_nll(net: Transformer, tokens, positions, mask, targets) -> torch.Tensor:  # noqa: ANN001
    logits = net(tokens, positions, mask).double()
    logits[..., MASK_ID] = float("-inf")
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mdlm_masks_only_targets_and_attends_to_valid_keys(
    make_tiny_model: Callable[..., Transformer], seed: int
) -> None:
    net = make_tiny_model(seed=12)
    spy = Spy(net)
    batch = make_batch(12 + seed)
    eps = 1e-3
    with torch.no_grad():
        out = make_paradigm("mdlm", MDLMConfig(eps=eps), mask_id=MASK_ID).loss(
            spy, batch, torch.Generator().manual_seed(seed)
        )
    ((xt, positions, mask),) = spy.calls
    masked = xt == MASK_ID
    assert not (masked & ~batch.is_target).any()
    assert torch.equal(torch.where(masked, batch.tokens, xt), batch.tokens)
    assert torch.equal(positions.expand(5, L), torch.arange(L).expand(5, L))
    ref_mask = batch.valid[:, None, None, :].expand(5, 1, L, L)
    assert torch.equal(mask.expand(5, 1, L, L), ref_mask)
    # nll_sum = (1/t) * sum of masked-token NLLs, with 1/t in [1, 1/eps]
    with torch.no_grad():
        tok_nll = _per_token_nll(net, xt, positions, ref_mask, batch.tokens)
    per_seq = []
    for b in range(5):
        s = float((tok_nll[b] * masked[b]).sum())
        if masked[b].any():
            ratio = float(out.nll_sum[b]) / s
            assert 1 - 1e-5 <= ratio <= 1 / eps + 1e-3
            per_seq.append(s / int(masked[b].sum()))
        else:
            assert float(out.nll_sum[b]) == 0.0
    # training objective: mean CE over each sequence's masked tokens, then over sequences
    assert out.loss.item() == pytest.approx(sum(per_seq) / len(per_seq), abs=1e-5)


@pytest.mark.parametrize("S", [1, 3, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_bd3lm_inputs_and_mask(
    make_tiny_model: Callable[..., Transformer], S: int, seed: int
) -> None:
    net = make_tiny_model(seed=13)
    spy = Spy(net)
    batch = make_batch(13 + seed)
    with torch.no_grad():
        out = make_paradigm("bd3lm", BD3LMConfig(block_size=S), mask_id=MASK_ID).loss(
            spy, batch, torch.Generator().manual_seed(seed)
        )
    ((x, positions, mask),) = spy.calls
    assert torch.equal(x[:, :L], batch.tokens)  # clean copy first
    xt = x[:, L:]
    masked = xt == MASK_ID
    assert not (masked & ~batch.is_target).any()
    assert torch.equal(torch.where(masked, batch.tokens, xt), batch.tokens)
    # (the plain draw, as evaluation uses it: spec 5.6's mask in every block is training-only,
    # test_bd3lm_training_masks_every_block)
    assert torch.equal(positions.expand(5, 2 * L), torch.arange(L).repeat(2).expand(5, 2 * L))
    # mask = block-diffusion rule table AND valid keys
    ref = torch.zeros(5, 1, 2 * L, 2 * L, dtype=torch.bool)
    valid2 = torch.cat((batch.valid, batch.valid), 1)
    for q in range(2 * L):
        for k in range(2 * L):
            bq, bk = (q % L) // S, (k % L) // S
            if q < L and k < L:
                rule = bq >= bk
            elif q >= L and k < L:
                rule = bq > bk
            elif q >= L and k >= L:
                rule = bq == bk
            else:
                rule = False
            ref[:, 0, q, k] = rule & valid2[:, k]
    assert torch.equal(mask.expand(5, 1, 2 * L, 2 * L), ref)
    with torch.no_grad():
        tok_nll = _per_token_nll(net, x, positions, ref, batch.tokens.repeat(1, 2))[:, L:]
    per_seq = []
    for b in range(5):
        s = float((tok_nll[b] * masked[b]).sum())
        assert float(out.nll_sum[b]) >= s - 1e-4  # weights 1/t >= 1
        assert float(out.nll_sum[b]) <= s / 1e-3 + 1e-3
        if masked[b].any():
            per_seq.append(s / int(masked[b].sum()))
    assert out.loss.item() == pytest.approx(sum(per_seq) / len(per_seq), abs=1e-5)


@pytest.mark.parametrize("S", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bd3lm_training_masks_every_block(
    make_tiny_model: Callable[..., Transformer], S: int, seed: int
) -> None:
    """Training draws (spec 5.6): every block holding a target has a mask, and the draw only
    adds one where the plain draw had none; evaluation (sample_noise) keeps the plain draw."""
    batch = make_batch(40 + seed)
    paradigm = make_paradigm("bd3lm", BD3LMConfig(block_size=S), mask_id=MASK_ID)
    noise = paradigm.training_noise(batch, torch.Generator().manual_seed(seed))
    plain = {k: v for k, v in noise.items() if k != "mask_every_block"}
    assert plain.keys() == paradigm.sample_noise(batch).keys()

    def masked_by(draw: dict[str, torch.Tensor]) -> torch.Tensor:
        spy = Spy(make_tiny_model(seed=13))
        with torch.no_grad():
            paradigm.loss(spy, batch, noise=draw)
        return spy.calls[0][0][:, L:] == MASK_ID

    forced, drawn = masked_by(noise), masked_by(plain)
    assert not (forced & ~batch.is_target).any()
    assert (drawn <= forced).all()  # the draw's masks stay
    for b in range(batch.tokens.shape[0]):
        for start in range(0, L, S):
            block = slice(start, start + S)
            if batch.is_target[b, block].any():
                assert forced[b, block].any(), (b, start)
            if drawn[b, block].any() or not batch.is_target[b, block].any():
                assert torch.equal(forced[b, block], drawn[b, block])
            else:
                assert int(forced[b, block].sum()) == 1
    off = make_paradigm("bd3lm", BD3LMConfig(block_size=S, mask_every_block=False), mask_id=MASK_ID)
    assert off.training_noise(batch, torch.Generator().manual_seed(seed)).keys() == plain.keys()


def _is_suffix(masked: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether `masked` (1-D) is a suffix of the `targets` positions (empty and all included)."""
    flags = masked[targets].tolist()
    return flags == sorted(flags)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mdlm_ltr_share_masks_answer_suffix_and_padding(
    make_tiny_model: Callable[..., Transformer], seed: int
) -> None:
    """`ltr_share`: its rows are masked as left-to-right decoding leaves them, a suffix of the
    answer of about t n tokens and every padding slot; other rows keep the independent draw,
    and evaluation (sample_noise) never draws it."""
    batch = make_batch(60 + seed)
    cfg = MDLMConfig(pad_targets=True, ltr_share=0.5)
    paradigm = make_paradigm("mdlm", cfg, mask_id=MASK_ID)
    noise = paradigm.training_noise(batch, torch.Generator().manual_seed(seed))
    assert "ltr" not in paradigm.sample_noise(batch)
    noise["ltr"] = torch.tensor([True, True, True, False, True])
    spy = Spy(make_tiny_model(seed=13))
    with torch.no_grad():
        paradigm.loss(spy, batch, noise=noise)
    masked = spy.calls[0][0] == MASK_ID
    answer, padding = batch.is_target, ~batch.valid
    plain = batch.with_padding_as_target().is_target & (
        noise["u"] < (1 - cfg.eps) * noise["t"][:, None]
    )
    for b in range(batch.tokens.shape[0]):
        if not noise["ltr"][b]:
            assert torch.equal(masked[b], plain[b])
            continue
        assert _is_suffix(masked[b], answer[b]), b
        assert masked[b][padding[b]].all() and not masked[b][batch.is_context[b]].any()
        n = int(answer[b].sum())
        expected = round((1 - cfg.eps) * float(noise["t"][b]) * n)
        assert abs(int(masked[b][answer[b]].sum()) - expected) <= 1, b


@pytest.mark.parametrize("S", [2, 3, 4])
def test_bd3lm_ltr_share_masks_a_suffix_of_every_block(
    make_tiny_model: Callable[..., Transformer], S: int
) -> None:
    """BD3LM's `ltr_share`: in its rows each block's masks are a suffix of the block's targets
    (and, with mask_every_block, never empty where the block has a target)."""
    batch = make_batch(70 + S)
    paradigm = make_paradigm("bd3lm", BD3LMConfig(block_size=S, ltr_share=1.0), mask_id=MASK_ID)
    noise = paradigm.training_noise(batch, torch.Generator().manual_seed(S))
    assert noise["ltr"].all() and "ltr" not in paradigm.sample_noise(batch)
    spy = Spy(make_tiny_model(seed=13))
    with torch.no_grad():
        paradigm.loss(spy, batch, noise=noise)
    masked = spy.calls[0][0][:, L:] == MASK_ID
    for b in range(batch.tokens.shape[0]):
        for start in range(0, L, S):
            block = slice(start, start + S)
            targets = batch.is_target[b, block]
            assert _is_suffix(masked[b, block], targets), (b, start)
            assert masked[b, block].any() == targets.any(), (b, start)


def test_mdlm_anneal_opens_the_canvas_from_causal_to_bidirectional(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    """`anneal`: at the first step every query sees only valid keys at or before it (the prompt
    is causal anyway, so the whole mask is causal); once the annealed share of training is past,
    the draw is the plain one (no `open` draw: the bidirectional canvas), and an all-open draw
    gives that same mask; in between a later canvas key is visible with the opened share.
    Evaluation never anneals."""
    batch = make_batch(70)
    paradigm = make_paradigm("mdlm", MDLMConfig(causal_prompt=True, anneal=0.5), mask_id=MASK_ID)
    g = torch.Generator().manual_seed(0)
    assert "open" not in paradigm.sample_noise(batch)
    assert "open" not in paradigm.training_noise(batch, g, progress=0.5)
    middle = paradigm.training_noise(batch, g, progress=0.2)["open"]
    assert abs(middle.float().mean().item() - 0.4) < 0.05

    def mask_of(noise: dict[str, torch.Tensor]) -> torch.Tensor:
        spy = Spy(make_tiny_model(seed=13))
        with torch.no_grad():
            paradigm.loss(spy, batch, noise=noise)
        return spy.calls[0][2][:, 0]  # (B, L, L)

    start = paradigm.training_noise(batch, g, progress=0.0)
    assert not start["open"].any()
    plain = {k: v for k, v in start.items() if k != "open"}
    at_start, bidirectional = mask_of(start), mask_of(plain)
    for b in range(batch.tokens.shape[0]):
        assert torch.equal(at_start[b], causal(L) & batch.valid[b][None]), b
    assert not torch.equal(at_start, bidirectional)
    assert torch.equal(mask_of(dict(plain, open=torch.ones_like(start["open"]))), bidirectional)
    with pytest.raises(ValueError, match="anneal needs causal_prompt"):
        MDLMConfig(anneal=0.5)
