"""Samplers against hand-written reference decoders, structural properties, argument checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from setdiff.model import Transformer
from setdiff.paradigm import BD3LMConfig, MDLMConfig, SetDLMConfig, make_paradigm
from setdiff.sampling.loop import GenerateResult, generate
from setdiff.sampling.policies import decode_policy

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
PROMPTS = {1: [1], 3: [1, 5, 7], 7: [1, 5, 7, 9, 11, 13, 15]}


def _greedy(logits: torch.Tensor) -> tuple[int, float]:
    logits = logits.double().clone()
    logits[MASK_ID] = float("-inf")
    probs = torch.softmax(logits, -1)
    return int(probs.argmax()), float(probs.max())


def _accept(conf: list[float], threshold: float | None) -> list[int]:
    """Indices accepted: the most confident (first on ties) plus every one >= threshold."""
    best = max(range(len(conf)), key=lambda i: (conf[i], -i))
    keep = {best}
    if threshold is not None:
        keep |= {i for i, c in enumerate(conf) if c >= threshold}
    return sorted(keep)


@torch.no_grad()
def ref_set_decode(
    net: Transformer, prompt: list[int], n: int, window: int, threshold: float | None
) -> tuple[list[int], list[list[int]]]:
    """Spec 5.1 without a cache: committed tokens form one causal stream in commit order
    (prompt, then each step's accepted tokens left to right); each [MASK] query in
    [frontier, frontier + W) sees every committed token and itself."""
    P = len(prompt)
    canvas = prompt + [MASK_ID] * n
    committed: list[int] = list(range(P))  # positions, in commit order
    steps: list[list[int]] = []
    while MASK_ID in canvas[P:]:
        masked = [p for p in range(P, P + n) if canvas[p] == MASK_ID]
        f = masked[0]
        queries = [p for p in masked if p < f + window]
        C, M = len(committed), len(queries)
        toks = torch.tensor([canvas[p] for p in committed] + [MASK_ID] * M)
        pos = torch.tensor(committed + queries)
        mask = torch.zeros(C + M, C + M, dtype=torch.bool)
        for i in range(C):
            for j in range(i + 1):
                mask[i, j] = True
        for qi in range(M):
            mask[C + qi, :C] = True
            mask[C + qi, C + qi] = True
        logits = net(toks[None], pos[None], mask)[0, C:]
        picks = [_greedy(lg) for lg in logits]
        keep = _accept([c for _, c in picks], threshold)
        accepted = [queries[i] for i in keep]
        for i in keep:
            canvas[queries[i]] = picks[i][0]
        committed += sorted(accepted)
        steps.append(sorted(accepted))
    return canvas[P:], steps


@torch.no_grad()
def ref_ar_style_setdlm(net: Transformer, prompt: list[int], n: int) -> list[int]:
    """The issue's reference: for each new position p, [committed tokens causal] + [MASK at p]."""
    seq = list(prompt)
    for _ in range(n):
        p = len(seq)
        toks = torch.tensor(seq + [MASK_ID])[None]
        pos = torch.arange(p + 1)[None]
        mask = torch.ones(p + 1, p + 1, dtype=torch.bool).tril()
        mask[p, :] = True
        seq.append(_greedy(net(toks, pos, mask)[0, -1])[0])
    return seq[len(prompt) :]


@torch.no_grad()
def ref_block_decode(
    net: Transformer, prompt: list[int], n: int, S: int, threshold: float | None
) -> tuple[list[int], list[list[int]]]:
    """BD3LM (spec 5.4): blocks of S at absolute positions; each forward = finished blocks
    (block-causal, bidirectional inside a block) + the current block (prompt tokens and decoded
    tokens clean, the rest [MASK]) attending to the finished blocks and the whole current block."""
    P = len(prompt)
    canvas = prompt + [MASK_ID] * n
    steps: list[list[int]] = []
    while MASK_ID in canvas[P:]:
        f = canvas.index(MASK_ID, P)
        start = f // S * S
        end = min(start + S, P + n)
        T = end
        blk = [q // S for q in range(T)]
        mask = torch.zeros(T, T, dtype=torch.bool)
        for q in range(T):
            for k in range(T):
                if q < start:
                    mask[q, k] = k < start and blk[k] <= blk[q]
                else:
                    mask[q, k] = True
        logits = net(torch.tensor(canvas[:T])[None], torch.arange(T)[None], mask)[0]
        cand = [q for q in range(start, end) if canvas[q] == MASK_ID]
        picks = [_greedy(logits[q]) for q in cand]
        keep = _accept([c for _, c in picks], threshold)
        for i in keep:
            canvas[cand[i]] = picks[i][0]
        steps.append(sorted(cand[i] for i in keep))
    return canvas[P:], steps


@torch.no_grad()
def ref_mdlm_decode(
    net: Transformer,
    prompt: list[int],
    n: int,
    chunk: int,
    threshold: float | None,
    causal_prompt: bool = False,
) -> tuple[list[int], list[list[int]]]:
    """MDLM (spec 5.4): every forward sees the whole canvas bidirectionally (with
    `causal_prompt`, prompt position q sees only positions <= q); candidates are the masked
    positions of the current chunk (chunks of `chunk` from the first generated slot)."""
    P = len(prompt)
    canvas = prompt + [MASK_ID] * n
    mask = None
    if causal_prompt:
        mask = torch.ones(P + n, P + n, dtype=torch.bool)
        for q in range(P):
            mask[q, q + 1 :] = False
    steps: list[list[int]] = []
    while MASK_ID in canvas[P:]:
        f = canvas.index(MASK_ID, P)
        lo = P + (f - P) // chunk * chunk
        logits = net(torch.tensor(canvas)[None], torch.arange(P + n)[None], mask)[0]
        cand = [q for q in range(lo, min(lo + chunk, P + n)) if canvas[q] == MASK_ID]
        picks = [_greedy(logits[q]) for q in cand]
        keep = _accept([c for _, c in picks], threshold)
        for i in keep:
            canvas[cand[i]] = picks[i][0]
        steps.append(sorted(cand[i] for i in keep))
    return canvas[P:], steps


@torch.no_grad()
def ref_aogpt_confidence(net: Transformer, prompt: list[int], n: int) -> tuple[list[int], list]:
    """Any-order AR, confidence order: commit order = decode order (a causal stream); every
    masked position is a query seeing all committed tokens and itself; decode the most
    confident one per step."""
    P = len(prompt)
    canvas = prompt + [MASK_ID] * n
    committed = list(range(P))
    steps = []
    while MASK_ID in canvas[P:]:
        queries = [p for p in range(P, P + n) if canvas[p] == MASK_ID]
        C, M = len(committed), len(queries)
        mask = torch.zeros(C + M, C + M, dtype=torch.bool)
        mask[:C, :C] = torch.ones(C, C, dtype=torch.bool).tril()
        mask[C:, :C] = True
        mask[C:, C:] = torch.eye(M, dtype=torch.bool)
        toks = torch.tensor([canvas[p] for p in committed] + [MASK_ID] * M)
        pos = torch.tensor(committed + queries)
        logits = net(toks[None], pos[None], mask)[0, C:]
        picks = [_greedy(lg) for lg in logits]
        (i,) = _accept([c for _, c in picks], None)
        canvas[queries[i]] = picks[i][0]
        committed.append(queries[i])
        steps.append([queries[i]])
    return canvas[P:], steps


def gen(net: Any, name: str, prompt: list[int], n: int, config: Any = None, **kw: Any):  # noqa: ANN201
    return generate(
        net, prompt, max_new_tokens=n, paradigm=make_paradigm(name, config, mask_id=MASK_ID), **kw
    )


@pytest.fixture
def sharp_model(make_tiny_model: Callable[..., Transformer]) -> Transformer:
    return make_tiny_model(seed=0, head_scale=20.0)


# ---------------------------------------------------------------------------------------------
# references


@pytest.mark.parametrize("prompt_len", [1, 3, 7])
@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("head_scale", [1.0, 20.0])
def test_setdlm_w1_is_ar_style_over_identity_order(
    make_tiny_model: Callable[..., Transformer], prompt_len: int, use_cache: bool, head_scale: float
) -> None:
    net = make_tiny_model(seed=3, head_scale=head_scale)
    prompt, n = PROMPTS[prompt_len], 12
    res = gen(net, "setdlm", prompt, n, use_cache=use_cache, window=1, threshold="off")
    assert res.tokens == ref_ar_style_setdlm(net, prompt, n)
    assert res.nfe == n == len(res.steps)  # the prefill rides on the first query
    assert res.steps == [[p] for p in range(prompt_len, prompt_len + n)]
    assert not res.stopped


@pytest.mark.parametrize("window", [1, 2, 4, 8])
@pytest.mark.parametrize("threshold", [None, 0.5, 0.05])
@pytest.mark.parametrize("prompt_len", [1, 3])
def test_setdlm_matches_reference_decoder(
    sharp_model: Transformer, window: int, threshold: float | None, prompt_len: int
) -> None:
    prompt, n = PROMPTS[prompt_len], 14
    res = gen(sharp_model, "setdlm", prompt, n, window=window, threshold=threshold)
    tokens, steps = ref_set_decode(sharp_model, prompt, n, window, threshold)
    assert res.tokens == tokens
    assert [sorted(s) for s in res.steps] == steps
    assert res.nfe == len(steps)


@pytest.mark.parametrize("S", [1, 3, 4])
@pytest.mark.parametrize("threshold", [None, 0.5])
@pytest.mark.parametrize("prompt_len", [1, 3, 7])
def test_bd3lm_matches_reference_decoder(
    sharp_model: Transformer, S: int, threshold: float | None, prompt_len: int
) -> None:
    prompt, n = PROMPTS[prompt_len], 10
    res = gen(sharp_model, "bd3lm", prompt, n, BD3LMConfig(block_size=S), threshold=threshold)
    tokens, steps = ref_block_decode(sharp_model, prompt, n, S, threshold)
    assert res.tokens == tokens
    assert [sorted(s) for s in res.steps] == steps


@pytest.mark.parametrize("causal_prompt", [False, True])
@pytest.mark.parametrize("chunk", [3, 32])
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_mdlm_matches_reference_decoder(
    sharp_model: Transformer, chunk: int, threshold: float | None, causal_prompt: bool
) -> None:
    prompt, n = PROMPTS[3], 10
    config = MDLMConfig(causal_prompt=causal_prompt)
    res = gen(sharp_model, "mdlm", prompt, n, config, chunk_size=chunk, threshold=threshold)
    tokens, steps = ref_mdlm_decode(sharp_model, prompt, n, chunk, threshold, causal_prompt)
    assert res.tokens == tokens
    assert [sorted(s) for s in res.steps] == steps
    assert res.nfe == len(steps)


def test_aogpt_confidence_matches_reference_decoder(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    net = make_tiny_model(seed=4, head_scale=3.0)
    prompt, n = PROMPTS[3], 10
    res = gen(net, "aogpt", prompt, n, order="confidence")
    tokens, steps = ref_aogpt_confidence(net, prompt, n)
    assert res.tokens == tokens and res.steps == steps
    assert res.nfe == n


@pytest.mark.parametrize("prompt_len", [1, 3])
def test_ar_matches_greedy_next_token_loop(
    make_tiny_model: Callable[..., Transformer], prompt_len: int
) -> None:
    net = make_tiny_model(seed=5, head_scale=3.0)
    prompt, n = PROMPTS[prompt_len], 12
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            T = len(seq)
            logits = net(
                torch.tensor(seq)[None], torch.arange(T)[None], torch.ones(T, T).tril().bool()
            )
            seq.append(_greedy(logits[0, -1])[0])
    res = gen(net, "ar", prompt, n)
    assert res.tokens == seq[prompt_len:]
    assert res.nfe == n


# ---------------------------------------------------------------------------------------------
# structural properties


CASES = [
    ("ar", None, {}),
    ("setdlm", None, {"window": 1}),
    ("setdlm", None, {"window": 4, "threshold": 0.05}),
    ("setdlm", None, {"window": 8, "threshold": 0.5}),
    ("setdlm", None, {"window": "all", "threshold": 0.5}),
    ("setdlm", SetDLMConfig(set_size=2), {"window": 3, "threshold": 0.2}),
    ("aogpt", None, {"order": "random"}),
    ("aogpt", None, {"order": "confidence"}),
    ("bd3lm", None, {"threshold": 0.05}),
    ("bd3lm", BD3LMConfig(block_size=3), {}),
    ("mdlm", None, {"chunk_size": 5, "threshold": 0.05}),
    ("mdlm", None, {"chunk_size": 4, "order": "random"}),
    ("mdlm", None, {"chunk_size": 32}),
]


def _decoded_before(res: GenerateResult, start: int, end: int) -> list[set[int]]:
    """For each step, the generated positions still masked just before it."""
    masked = set(range(start, end))
    out = []
    for step in res.steps:
        out.append(set(masked))
        masked -= set(step)
    return out


@pytest.mark.parametrize(("name", "config", "kw"), CASES)
@pytest.mark.parametrize("prompt_len", [1, 7])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_structure(
    sharp_model: Transformer, name: str, config: Any, kw: dict, prompt_len: int, temperature: float
) -> None:
    prompt, n = PROMPTS[prompt_len], 17
    res = gen(sharp_model, name, prompt, n, config, temperature=temperature, seed=3, **kw)
    start, end = prompt_len, prompt_len + n
    assert len(res.tokens) == n and MASK_ID not in res.tokens and not res.stopped
    flat = [p for s in res.steps for p in s]
    assert sorted(flat) == list(range(start, end))  # each generated position exactly once
    assert all(len(s) >= 1 for s in res.steps)
    block = getattr(config, "block_size", 4)
    if name == "bd3lm" and prompt_len < block:
        # one extra commit-only forward: see test_bd3lm_short_prompt_has_no_commit_only_forward
        assert res.nfe in (len(res.steps), len(res.steps) + 1)
    else:
        assert res.nfe == len(res.steps)  # every forward decodes (the prefill is fused)
    before = _decoded_before(res, start, end)
    for step, masked in zip(res.steps, before, strict=True):
        assert set(step) <= masked
        f = min(masked)
        if name == "setdlm" and kw["window"] != "all":
            assert max(step) < f + kw["window"]
            assert len(step) <= kw["window"]
        if name == "bd3lm":
            lo = f // block * block
            assert all(lo <= p < lo + block for p in step)
        if name == "mdlm":
            lo = start + (f - start) // kw["chunk_size"] * kw["chunk_size"]
            assert all(lo <= p < lo + kw["chunk_size"] for p in step)
        if name in ("ar", "aogpt"):
            assert len(step) == 1
        if name == "ar":
            assert step == [f]


class BoostMaskLogit(nn.Module):
    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, tokens, positions, mask=None, cache=None):  # noqa: ANN001, ANN201
        logits = self.inner(tokens, positions, mask, cache).clone()
        logits[..., MASK_ID] += 1e4
        return logits


@pytest.mark.parametrize(("name", "config", "kw"), CASES[:3] + CASES[6:9] + CASES[10:11])
def test_mask_token_never_chosen(
    sharp_model: Transformer, name: str, config: Any, kw: dict
) -> None:
    a = gen(sharp_model, name, PROMPTS[3], 12, config, **kw)
    b = gen(BoostMaskLogit(sharp_model), name, PROMPTS[3], 12, config, **kw)
    assert MASK_ID not in b.tokens
    assert a.tokens == b.tokens and a.steps == b.steps


@pytest.mark.parametrize(("name", "config", "kw"), CASES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stop_ids_truncate_after_stop(
    make_tiny_model: Callable[..., Transformer],
    name: str,
    config: Any,
    kw: dict,
    temperature: float,
) -> None:
    # Untrained mask-query models repeat one token under greedy decoding; sampling at
    # temperature 1 (seeded) gives varied outputs, so there is something to stop on.
    net = make_tiny_model(seed=0, head_scale=1.0 if temperature else 3.0)
    prompt, n = PROMPTS[3], 16
    kw = dict(kw, temperature=temperature, seed=11)
    full = gen(net, name, prompt, n, config, **kw)
    assert not full.stopped and len(full.tokens) == n
    firsts = [j for j, t in enumerate(full.tokens) if t not in full.tokens[:j] and 1 <= j < n - 1]
    if temperature == 0.0 and not firsts:
        pytest.skip("greedy generation repeats one token: nothing to stop on")
    assert firsts, full.tokens
    j = firsts[-1]
    stop = full.tokens[j]
    later = next(t for t in range(4, 24) if t not in full.tokens[: j + 1])  # fires no sooner
    res = gen(net, name, prompt, n, config, stop_ids=[stop, later], **kw)
    assert res.stopped
    assert res.tokens == full.tokens[: j + 1]
    assert res.nfe <= full.nfe
    # a stop id that never appears changes nothing
    unused = [t for t in range(4, 24) if t not in full.tokens]
    if unused:
        same = gen(net, name, prompt, n, config, stop_ids=[unused[0]], **kw)
        assert same.tokens == full.tokens and not same.stopped and same.nfe == full.nfe


@pytest.mark.parametrize(("prompt", "S"), [([1], 4), ([1, 5], 3), ([], 4)])
def test_bd3lm_short_prompt_has_no_commit_only_forward(
    sharp_model: Transformer, monkeypatch: pytest.MonkeyPatch, prompt: list[int], S: int
) -> None:
    calls: list[tuple[int, int]] = []
    inner = sharp_model.forward

    def counting(tokens, positions, mask=None, cache=None):  # noqa: ANN001, ANN202
        calls.append((tokens.shape[1], cache.lengths[0] if cache is not None else -1))
        return inner(tokens, positions, mask, cache)

    monkeypatch.setattr(sharp_model, "forward", counting)
    res = gen(sharp_model, "bd3lm", prompt, 3 * S, BD3LMConfig(block_size=S))
    # no prompt block to prefill: every forward must decode at least one token
    assert res.nfe == len(res.steps) == len(calls)


def test_stop_on_first_token(sharp_model: Transformer) -> None:
    full = gen(sharp_model, "setdlm", PROMPTS[3], 10, window=1)
    res = gen(sharp_model, "setdlm", PROMPTS[3], 10, window=1, stop_ids=[full.tokens[0]])
    assert res.stopped and res.tokens == full.tokens[:1] and res.nfe == 1


# ---------------------------------------------------------------------------------------------
# argument validation: ValueError naming the argument, before any compute


@pytest.fixture
def no_compute(sharp_model: Transformer, monkeypatch: pytest.MonkeyPatch) -> Transformer:
    def boom(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("forward must not run before argument validation")

    monkeypatch.setattr(sharp_model, "forward", boom)
    return sharp_model


def test_no_compute_fixture_really_blocks(no_compute: Transformer) -> None:
    with pytest.raises(RuntimeError, match="must not run"):
        gen(no_compute, "setdlm", PROMPTS[3], 4)


@pytest.mark.parametrize("set_size", [0, -1])
def test_set_size_below_one(set_size: int) -> None:
    with pytest.raises(ValueError, match="set_size"):
        SetDLMConfig(set_size=set_size)


def test_window_above_smax(no_compute: Transformer) -> None:
    with pytest.raises(ValueError, match="window"):
        gen(no_compute, "setdlm", PROMPTS[3], 4, SetDLMConfig(set_size=4), window=9)
    with pytest.raises(ValueError, match="window"):
        gen(no_compute, "setdlm", PROMPTS[3], 4, SetDLMConfig(set_size=2), window=5)
    for bad in (0, -1, 2.5, "wide"):
        with pytest.raises(ValueError, match="window"):
            gen(no_compute, "setdlm", PROMPTS[3], 4, window=bad)


@pytest.mark.parametrize("name", ["setdlm", "bd3lm", "mdlm"])
@pytest.mark.parametrize("threshold", [0, 0.0, 1.5, -1, 1e6, "0.5", "high"])
def test_bad_threshold(no_compute: Transformer, name: str, threshold: Any) -> None:
    with pytest.raises(ValueError, match="threshold"):
        gen(no_compute, name, PROMPTS[3], 4, threshold=threshold)


@pytest.mark.parametrize("name", ["setdlm", "bd3lm", "mdlm"])
@pytest.mark.parametrize("threshold", ["off", None, 1.0, 1e-9])
def test_good_threshold(sharp_model: Transformer, name: str, threshold: Any) -> None:
    res = gen(sharp_model, name, PROMPTS[3], 4, threshold=threshold)
    assert len(res.tokens) == 4


@pytest.mark.parametrize("name", ["setdlm", "bd3lm", "mdlm"])
def test_threshold_is_parsed_once_into_the_policy(name: str) -> None:
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    assert decode_policy(paradigm, {"threshold": "off"}).threshold is None
    assert decode_policy(paradigm, {}).threshold is None
    policy = decode_policy(paradigm, {"threshold": 1})
    assert policy.threshold == 1.0 and isinstance(policy.threshold, float)
    with pytest.raises(ValueError, match="threshold must be in \\(0, 1\\] or 'off'"):
        decode_policy(paradigm, {"threshold": "high"})
    with pytest.raises(ValueError, match="threshold"):  # a built policy holds float | None only
        type(policy)(threshold="off")


@pytest.mark.parametrize(
    ("name", "shift", "needs_prompt", "can_infill", "exact_likelihood"),
    [
        ("ar", None, True, False, True),
        ("setdlm", False, True, True, False),
        ("aogpt", False, True, True, False),
        ("bd3lm", False, False, False, False),
        ("bd3lm", True, True, False, False),
        ("mdlm", False, False, True, False),
        ("mdlm", True, True, True, False),
    ],
)
def test_paradigm_capabilities(
    name: str, shift: bool | None, needs_prompt: bool, can_infill: bool, exact_likelihood: bool
) -> None:
    from setdiff.paradigm import PARADIGMS

    config_cls = PARADIGMS[name][0]
    config = config_cls() if shift is None else config_cls(shift=shift)
    paradigm = make_paradigm(name, config, mask_id=MASK_ID)
    assert (paradigm.needs_prompt, paradigm.can_infill, paradigm.exact_likelihood) == (
        needs_prompt,
        can_infill,
        exact_likelihood,
    )


def test_unknown_paradigm() -> None:
    with pytest.raises(ValueError, match="paradigm"):
        make_paradigm("foo", mask_id=3)
    with pytest.raises(ValueError, match="SetDLMConfig"):
        make_paradigm("setdlm", BD3LMConfig(), mask_id=3)


@pytest.mark.parametrize("name", ["ar", "setdlm", "aogpt", "bd3lm", "mdlm"])
def test_unknown_decode_option(no_compute: Transformer, name: str) -> None:
    with pytest.raises(ValueError, match="frobnicate"):
        gen(no_compute, name, PROMPTS[3], 4, frobnicate=1)


def test_fixed_options_cannot_be_overridden(no_compute: Transformer) -> None:
    with pytest.raises(ValueError, match="max_window"):
        gen(no_compute, "setdlm", PROMPTS[3], 4, max_window=64, window=16)
    with pytest.raises(ValueError, match="block_size"):
        gen(no_compute, "bd3lm", PROMPTS[3], 4, block_size=2)


@pytest.mark.parametrize("name", ["ar", "setdlm", "aogpt", "bd3lm", "mdlm"])
def test_prompt_longer_than_context(no_compute: Transformer, name: str) -> None:
    prompt = [5] * 129  # max_seq_len = 128
    with pytest.raises(ValueError, match="prompt"):
        gen(no_compute, name, prompt, 1)
    with pytest.raises(ValueError, match="max_seq_len"):
        gen(no_compute, name, [5] * 100, 29)  # prompt + new tokens overflow the context


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("setdlm", {"max_new_tokens": 0}, "max_new_tokens"),
        ("ar", {"suffix_ids": [5]}, "suffix_ids"),
        ("bd3lm", {"suffix_ids": [5]}, "suffix_ids"),
        ("setdlm", {"temperature": -1.0}, "temperature"),
        ("mdlm", {"top_p": 0.0}, "top_p"),
        ("setdlm", {"cache_size": 0}, "cache_size"),
        ("aogpt", {"order": "sideways"}, "order"),
        ("mdlm", {"chunk_size": 0}, "chunk_size"),
        ("setdlm", {"prompt_ids": []}, "prompt_ids"),
        ("ar", {"prompt_ids": torch.ones(1, 3, dtype=torch.long)}, "prompt_ids"),
    ],
)
def test_other_bad_arguments(no_compute: Transformer, name: str, kwargs: dict, match: str) -> None:
    args: dict[str, Any] = {"max_new_tokens": 4}
    prompt = kwargs.pop("prompt_ids", PROMPTS[3])
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate(no_compute, prompt, paradigm=make_paradigm(name, mask_id=MASK_ID), **args)


def test_missing_paradigm(no_compute: Transformer) -> None:
    with pytest.raises(ValueError, match="paradigm"):
        generate(no_compute, PROMPTS[3], max_new_tokens=4)


def test_any_decodable_model(sharp_model: Transformer) -> None:
    """`generate` takes any (net, paradigm, tokenizer) record, not only a `LoadedModel`."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Bundle:
        net: Transformer
        paradigm: Any
        tokenizer: Any | None = None

    paradigm = make_paradigm("setdlm", mask_id=MASK_ID)
    ours = generate(Bundle(sharp_model, paradigm), PROMPTS[3], max_new_tokens=6, window=4)
    bare = generate(sharp_model, PROMPTS[3], max_new_tokens=6, paradigm=paradigm, window=4)
    assert (ours.tokens, ours.steps, ours.nfe) == (bare.tokens, bare.steps, bare.nfe)
    with pytest.raises(ValueError, match="stop_strings"):
        generate(Bundle(sharp_model, paradigm), PROMPTS[3], max_new_tokens=6, stop_strings=["a"])


# ---------------------------------------------------------------------------------------------
# logits helpers (pure functions) against brute force


def test_accept_confident_semantics() -> None:
    from setdiff.sampling.logits import accept_confident

    def accepted(conf: torch.Tensor, threshold: float | None) -> list[int]:
        keep = accept_confident(conf.tolist(), threshold)
        return [i for i, k in enumerate(keep) if k]

    conf = torch.tensor([0.2, 0.5, 0.5, 0.9, 0.1])
    assert accepted(conf, None) == [3]
    assert accepted(conf, 0.5) == [1, 2, 3]  # ">= tau" (spec 5.1 step 6)
    assert accepted(conf, 0.95) == [3]  # the most confident is always taken
    assert accepted(torch.tensor([0.3]), 1.0) == [0]
    assert accepted(torch.tensor([0.4, 0.7, 0.7]), None) == [1]  # a tie: the first
    # compared in float32, as a float32 tensor compares with the threshold on the device
    at = torch.tensor([0.9, 0.95])  # float32(0.9) < 0.9 as a double
    assert (at >= 0.9).tolist() == [True, True] and accepted(at, 0.9) == [0, 1]


def _ref_nucleus(probs: list[float], top_p: float) -> list[float]:
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.8, 0.99, 1.0])
def test_nucleus_matches_reference(top_p: float) -> None:
    from setdiff.sampling.logits import nucleus

    g = torch.Generator().manual_seed(int(top_p * 100))
    probs = torch.softmax(torch.randn(6, 9, generator=g, dtype=torch.float64) * 2, -1)
    got = nucleus(probs, top_p)
    for row, ref_in in zip(got, probs.tolist(), strict=True):
        assert torch.allclose(row, torch.tensor(_ref_nucleus(ref_in, top_p), dtype=row.dtype))


def test_choose_tokens_greedy_and_sampled() -> None:
    from setdiff.sampling.logits import choose_tokens

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g)
    logits[:, MASK_ID] = 50.0  # would win if it were not excluded
    tokens, conf = choose_tokens(logits, mask_id=MASK_ID)
    ref = logits.clone()
    ref[:, MASK_ID] = float("-inf")
    probs = torch.softmax(ref, -1)
    assert torch.equal(tokens, probs.argmax(-1))
    assert torch.allclose(conf, probs.max(-1).values)
    # sampling at temperature T follows softmax(logits / T) without the mask token
    row = logits[:1].expand(30000, 7)
    tokens, conf = choose_tokens(row, mask_id=MASK_ID, temperature=2.0, generator=g)
    expected = torch.softmax(ref[0] / 2.0, -1)
    freq = torch.bincount(tokens, minlength=7).double() / 30000
    assert freq[MASK_ID] == 0
    assert torch.allclose(freq, expected.double(), atol=0.015)
    assert torch.allclose(conf, expected[tokens])


def test_greedy_table_equals_row_by_row() -> None:
    """The greedy table of a batch of rows (ties included) holds `choose_tokens`'s tokens and
    confidences of each row, whichever rows are chosen from together."""
    from setdiff.sampling.logits import choose_tokens, greedy_table, mask_bias

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 6, 11, generator=g) * 2
    logits[2, 1] = logits[2, 3]  # two rows of a row with equal confidences
    logits[3, 4, 5] = logits[3, 4, 7]  # a tie between two tokens of one row
    table = greedy_table(logits, mask_bias(MASK_ID, 11, logits.device))
    assert table.shape == (2, 5, 6)
    for rows in ([5], [1, 2, 3, 4], [1, 3], [0, 1, 2, 3, 4, 5], [4, 5]):
        for b in range(5):
            tokens, confidence = choose_tokens(logits[b, rows], mask_id=MASK_ID)
            assert torch.equal(table[0, b, rows].long(), tokens)
            assert torch.equal(table[1, b, rows], confidence)


def test_rows_without_queries_choose_nothing() -> None:
    """A batched setdlm forward whose rows query nothing (every row only commits) picks
    nothing for any row: no rows of the greedy table, and no sampled choice."""
    from setdiff.sampling.policies import DecodeContext, SetPolicy
    from setdiff.sampling.state import DecodeState, Plan

    states = [DecodeState.new([1, 4, 5], 3, [], MASK_ID) for _ in range(2)]
    plans = [Plan([0, 1, 2], [0, 1, 2], []) for _ in states]
    assert SetPolicy(window=2, threshold=0.9).rows_at_once(states, plans, [(0, 3)] * 2) == [[], []]
    ctx = DecodeContext(mask_id=MASK_ID, generator=torch.Generator(), n_new=3)
    sampled = SetPolicy(window=2, temperature=1.0)
    logits = torch.randn(3, 11)
    picks = [sampled.select(s, p, logits, ctx) for s, p in zip(states, plans, strict=True)]
    assert picks == [(), ()]


def test_a_vocabulary_beyond_float32_token_ids_is_refused() -> None:
    """Greedy choices reach the host as a float32 table, exact for token ids below 2**24: a
    larger vocabulary is refused in one line before any compute."""
    from types import SimpleNamespace

    class Huge(nn.Module):
        config = SimpleNamespace(vocab_size=2**24 + 1, max_seq_len=64)

        def forward(self, *args: Any) -> torch.Tensor:
            raise AssertionError("no forward may run")

    with pytest.raises(ValueError, match=r"vocab_size must be <= 2\*\*24 to decode, got 16777217"):
        generate(Huge(), [1], max_new_tokens=4, paradigm=make_paradigm("ar", mask_id=MASK_ID))
