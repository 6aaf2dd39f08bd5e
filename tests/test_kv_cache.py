"""KV cache: unit behaviour, cached == recomputed decoding for every paradigm, and overflow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from setdiff.kv_cache import KVCache
from setdiff.model import Transformer
from setdiff.paradigm import make_paradigm
from setdiff.sampling.loop import GenerateResult, generate

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
PROMPTS = {1: [1], 3: [1, 5, 7], 7: [1, 5, 7, 9, 11, 13, 15]}


def causal(n: int) -> torch.Tensor:
    return torch.tensor([[k <= q for k in range(n)] for q in range(n)], dtype=torch.bool)


# ---------------------------------------------------------------------------------------------
# KVCache unit behaviour


def _kv(n: int, start: float) -> torch.Tensor:
    """(B=1, G=1, n, E=2) keys whose values identify the entry."""
    vals = torch.arange(n, dtype=torch.float32) + start
    return vals[None, None, :, None].expand(1, 1, n, 2).clone()


def test_cache_stage_commit_crop() -> None:
    c = KVCache(n_layer=1, n_kv_head=1, head_dim=2, capacities=[8])
    k, v = c.stage(0, _kv(3, 0), _kv(3, 100))
    assert k.shape == (1, 1, 3, 2) and c.length == 0
    c.commit(2)  # keep the first two staged entries only
    assert c.length == 2
    k, _ = c.stage(0, _kv(2, 10), _kv(2, 110))  # overwrites the forgotten third entry
    assert k[0, 0, :, 0].tolist() == [0, 1, 10, 11]
    c.commit(1)
    assert c.length == 3
    c.crop(1)
    assert c.length == 1
    with pytest.raises(ValueError):
        c.crop(2)
    with pytest.raises(ValueError):
        c.commit(1)  # nothing staged


def test_cache_make_room_drops_oldest() -> None:
    c = KVCache(n_layer=2, n_kv_head=1, head_dim=2, capacities=[5])
    for layer in range(2):
        c.stage(layer, _kv(4, 0), _kv(4, 100))
    c.commit(4)
    assert c.make_room(1) == 0 and c.length == 4
    assert c.make_room(3) == 2
    assert c.length == 2 and c.dropped == 2
    for layer in range(2):
        k, v = c.stage(layer, _kv(3, 50), _kv(3, 150))
        assert k[0, 0, :, 0].tolist() == [2, 3, 50, 51, 52]  # the two newest survive, in order
        assert v[0, 0, :, 0].tolist() == [102, 103, 150, 151, 152]
    c.commit(3)
    assert c.length == 5
    with pytest.raises(ValueError):
        c.make_room(6)
    with pytest.raises(ValueError):
        c.stage(0, _kv(1, 0), _kv(1, 0))  # full: must make room first


# ---------------------------------------------------------------------------------------------
# inference path == training path (spec 11: "Inference equivalence")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_query_equals_two_copy_training_row(
    make_tiny_model: Callable[..., Transformer], seed: int
) -> None:
    """Commit clean tokens in a random order (random chunk sizes) into a cache, then query a
    [MASK] at the next position of the order: logits equal the training forward's noisy row."""
    net = make_tiny_model(seed=seed)
    g = torch.Generator().manual_seed(seed)
    L = 12
    x = torch.randint(4, 24, (L,), generator=g)
    perm = torch.randperm(L, generator=g)
    two_copy = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    two_copy[:L, :L] = causal(L)
    two_copy[L:, :L] = torch.ones(L, L, dtype=torch.bool).tril(-1)
    two_copy[L:, L:] = torch.eye(L, dtype=torch.bool)
    with torch.no_grad():
        xp = x[perm]
        train = net(
            torch.cat((xp, torch.full((L,), MASK_ID)))[None],
            torch.cat((perm, perm))[None],
            two_copy,
        )[0, L:]
        cache = KVCache.for_model(net, capacity=2 * L)
        r = 0
        while r < L:
            # query the [MASK] of rank r over the cache (length r)
            q = net(torch.tensor([[MASK_ID]]), perm[r : r + 1][None], None, cache)[0, -1]
            cache.crop(r)
            assert (q - train[r]).abs().max().item() <= 1e-5
            # commit the next chunk of clean tokens, causal within the chunk
            n = int(torch.randint(1, 4, (1,), generator=g))
            chunk = perm[r : r + n]
            mask = torch.ones(len(chunk), r + len(chunk), dtype=torch.bool)
            mask[:, r:] = causal(len(chunk))
            net(x[chunk][None], chunk[None], mask, cache)
            cache.commit(chunk.numel())
            r += len(chunk)


# ---------------------------------------------------------------------------------------------
# generate: use_cache=True == use_cache=False


def run_both(net: Any, name: str, prompt: list[int], n: int, **kw: Any) -> GenerateResult:
    p = make_paradigm(name, mask_id=MASK_ID)
    a = generate(net, prompt, max_new_tokens=n, paradigm=p, use_cache=True, trace_logits=True, **kw)
    b = generate(
        net, prompt, max_new_tokens=n, paradigm=p, use_cache=False, trace_logits=True, **kw
    )
    assert a.tokens == b.tokens
    assert a.steps == b.steps
    assert a.nfe == b.nfe == len(a.logits) == len(b.logits)
    for la, lb in zip(a.logits, b.logits, strict=True):
        assert la.shape == lb.shape
        assert (la - lb).abs().max().item() <= 1e-5
    assert len(a.tokens) == n and MASK_ID not in a.tokens
    return a


@pytest.fixture
def sharp_model(make_tiny_model: Callable[..., Transformer]) -> Transformer:
    return make_tiny_model(seed=0, head_scale=20.0)


@pytest.mark.parametrize("window", [1, 2, 4])
@pytest.mark.parametrize("threshold", [None, 0.5, 0.05])
@pytest.mark.parametrize("prompt_len", [1, 3, 7])
def test_setdlm_cache_equivalence(
    sharp_model: Transformer, window: int, threshold: float | None, prompt_len: int
) -> None:
    run_both(sharp_model, "setdlm", PROMPTS[prompt_len], 12, window=window, threshold=threshold)


def test_setdlm_any_order_window_cache_equivalence(sharp_model: Transformer) -> None:
    run_both(sharp_model, "setdlm", PROMPTS[3], 10, window="all", threshold=0.5)


def test_thresholds_matter_on_the_sharp_model(sharp_model: Transformer) -> None:
    off = run_both(sharp_model, "setdlm", PROMPTS[3], 12, window=4, threshold="off")
    low = run_both(sharp_model, "setdlm", PROMPTS[3], 12, window=4, threshold=0.05)
    assert off.nfe == 12
    assert low.nfe < off.nfe and max(len(s) for s in low.steps) > 1


@pytest.mark.parametrize("threshold", [None, 0.5, 0.05])
@pytest.mark.parametrize("prompt_len", [1, 3, 7])
def test_bd3lm_cache_equivalence(
    sharp_model: Transformer, threshold: float | None, prompt_len: int
) -> None:
    run_both(sharp_model, "bd3lm", PROMPTS[prompt_len], 13, threshold=threshold)


@pytest.mark.parametrize("threshold", [None, 0.5, 0.05])
@pytest.mark.parametrize("prompt_len", [1, 3, 7])
@pytest.mark.parametrize("chunk_size", [4, 32])
def test_mdlm_cache_equivalence(
    sharp_model: Transformer, threshold: float | None, prompt_len: int, chunk_size: int
) -> None:
    run_both(
        sharp_model, "mdlm", PROMPTS[prompt_len], 10, threshold=threshold, chunk_size=chunk_size
    )


@pytest.mark.parametrize("prompt_len", [1, 3, 7])
def test_ar_cache_equivalence(sharp_model: Transformer, prompt_len: int) -> None:
    run_both(sharp_model, "ar", PROMPTS[prompt_len], 12)


@pytest.mark.parametrize("order", ["random", "confidence"])
@pytest.mark.parametrize("prompt_len", [1, 3, 7])
def test_aogpt_cache_equivalence(sharp_model: Transformer, order: str, prompt_len: int) -> None:
    run_both(sharp_model, "aogpt", PROMPTS[prompt_len], 10, order=order)


SAMPLING = {
    "ar": {},
    "setdlm": {"window": 4, "threshold": 0.5},
    "aogpt": {"final_temperature": 0.5},
    "bd3lm": {"threshold": 0.5},
    "mdlm": {"threshold": 0.5, "chunk_size": 8},
}


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampling_is_seeded_and_cache_equivalent(
    make_tiny_model: Callable[..., Transformer], name: str
) -> None:
    net = make_tiny_model(seed=1, head_scale=3.0)
    kw = dict(SAMPLING[name], temperature=1.0, top_p=0.9)
    runs = [run_both(net, name, PROMPTS[3], 12, seed=s, **kw) for s in range(4)]
    again = run_both(net, name, PROMPTS[3], 12, seed=0, **kw)
    assert again.tokens == runs[0].tokens and again.steps == runs[0].steps
    assert len({tuple(r.tokens) for r in runs}) > 1  # the seed matters


@pytest.mark.parametrize("name", ["setdlm", "aogpt", "mdlm"])
@pytest.mark.parametrize("prompt_len", [1, 3])
def test_infilling_cache_equivalence(sharp_model: Transformer, name: str, prompt_len: int) -> None:
    kw = {"setdlm": {"window": 2, "threshold": 0.5}, "aogpt": {}, "mdlm": {"chunk_size": 4}}[name]
    suffix = [9, 10, 11]
    res = run_both(sharp_model, name, PROMPTS[prompt_len], 6, suffix_ids=suffix, **kw)
    decoded = sorted(p for step in res.steps for p in step)
    assert decoded == list(range(prompt_len, prompt_len + 6))  # never the suffix


def test_infilling_query_sees_the_suffix(sharp_model: Transformer) -> None:
    """First setdlm query (W = 1) == a hand-built forward over prompt + suffix (causal, in
    position order) plus one [MASK] at the first gap position that sees all of them."""
    prompt, suffix, n = [1, 5, 7], [9, 10, 11], 4
    res = generate(
        sharp_model,
        prompt,
        max_new_tokens=n,
        paradigm=make_paradigm("setdlm", mask_id=MASK_ID),
        suffix_ids=suffix,
        window=1,
        trace_logits=True,
    )
    given_pos = [0, 1, 2] + [3 + n + i for i in range(3)]
    toks = torch.tensor(prompt + suffix + [MASK_ID])
    pos = torch.tensor(given_pos + [3])
    mask = torch.ones(7, 7, dtype=torch.bool)
    mask[:6, :6] = causal(6)
    mask[:6, 6] = False
    with torch.no_grad():
        ref = sharp_model(toks[None], pos[None], mask)[0, -1]
    assert (res.logits[0][-1] - ref).abs().max().item() <= 1e-5
    # ... and the suffix really matters for that query
    with torch.no_grad():
        no_suffix = sharp_model(
            torch.tensor(prompt + [MASK_ID])[None], torch.tensor([0, 1, 2, 3])[None], None
        )[0, -1]
    assert (res.logits[0][-1] - no_suffix).abs().max().item() > 1e-3


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("setdlm", {"window": 4, "threshold": 0.5}),
        ("setdlm", {"window": 1}),
        ("ar", {}),
        ("bd3lm", {"threshold": 0.5}),
        ("aogpt", {"order": "confidence"}),
        ("mdlm", {}),
    ],
)
def test_long_generation(make_tiny_model: Callable[..., Transformer], name: str, kw: dict) -> None:
    # head_scale 3: sharp enough for thresholds, not so sharp that confidences saturate at 1.0
    # and tie (a tie's argmax would then hinge on 1e-7 float noise between the two paths).
    net = make_tiny_model(seed=0, head_scale=3.0)
    prompt, n = PROMPTS[3], 100
    res = run_both(net, name, prompt, n, **kw)
    total = len(prompt) + n
    # nothing was dropped: every committed token is still in the cache
    if name in ("setdlm", "aogpt"):
        assert res.cache_length == total - len(res.steps[-1])
    elif name == "ar":
        assert res.cache_length == total - 1
    elif name == "bd3lm":
        assert res.cache_length == (total - 1) // 4 * 4
    else:
        assert res.cache_length == 0  # mdlm commits nothing


# ---------------------------------------------------------------------------------------------
# overflow: a small cache drops the oldest entries


def _one_layer(make_tiny_model: Callable[..., Transformer]) -> Transformer:
    # With one layer a token's K/V depend only on (token, position), so a forward over just the
    # surviving entries reproduces the cached computation exactly.
    return make_tiny_model(seed=2, head_scale=20.0, n_layer=1)


@torch.no_grad()
def _ref_sliding(
    net: Transformer, prompt: list[int], n: int, capacity: int, mode: str
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding with a left-dropping cache, by hand ('ar' or 'set' = setdlm W = 1)."""
    cache: list[tuple[int, int]] = []  # (position, token) in commit order

    def forward(commits: list[tuple[int, int]], query: int | None) -> torch.Tensor:
        nonlocal cache
        n_new = len(commits) + (query is not None)
        while len(cache) + n_new > capacity:
            cache = cache[1:]
        keys = cache + commits + ([(query, MASK_ID)] if query is not None else [])
        toks = torch.tensor([t for _, t in keys])[None]
        pos = torch.tensor([p for p, _ in keys])[None]
        out = net(toks, pos, None)[0, -1]  # one layer: the last row only needs all keys
        cache = cache + commits
        return out

    def argmax(logits: torch.Tensor) -> int:
        logits = logits.clone()
        logits[MASK_ID] = float("-inf")
        return int(logits.argmax())

    given = list(enumerate(prompt))
    tokens: list[int] = []
    traced: list[torch.Tensor] = []
    P = len(prompt)
    if mode == "ar":
        out = forward(given, None)
        for i in range(n):
            traced.append(out)
            tokens.append(argmax(out))
            if i + 1 < n:
                out = forward([(P + i, tokens[-1])], None)
    else:
        for i in range(n):  # the first forward prefills the prompt with the first query
            commits = [(P + i - 1, tokens[-1])] if i else given
            out = forward(commits, P + i)
            traced.append(out)
            tokens.append(argmax(out))
    return tokens, traced


@pytest.mark.parametrize(
    ("name", "mode", "kw", "capacity"),
    [
        ("ar", "ar", {}, 3),
        ("ar", "ar", {}, 5),
        ("setdlm", "set", {"window": 1}, 4),
        ("setdlm", "set", {"window": 1}, 6),
    ],
)
def test_overflow_matches_sliding_window_reference(
    make_tiny_model: Callable[..., Transformer], name: str, mode: str, kw: dict, capacity: int
) -> None:
    net = _one_layer(make_tiny_model)
    prompt, n = PROMPTS[3], 30
    res = generate(
        net,
        prompt,
        max_new_tokens=n,
        paradigm=make_paradigm(name, mask_id=MASK_ID),
        cache_size=capacity,
        trace_logits=True,
        **kw,
    )
    ref_tokens, ref_logits = _ref_sliding(net, prompt, n, capacity, mode)
    assert res.tokens == ref_tokens
    traced = [lg[-1] for lg in res.logits]
    assert len(traced) == len(ref_logits)
    for a, b in zip(traced, ref_logits, strict=True):
        assert (a - b).abs().max().item() <= 1e-5
    assert res.cache_length <= capacity
    # the overflow changed something: a full cache gives other logits
    full = generate(
        net,
        prompt,
        max_new_tokens=n,
        paradigm=make_paradigm(name, mask_id=MASK_ID),
        trace_logits=True,
        **kw,
    )
    assert any(
        (a - b[-1]).abs().max().item() > 1e-4 for a, b in zip(ref_logits, full.logits, strict=True)
    )


@pytest.mark.parametrize(
    ("name", "kw", "capacity"),
    [
        ("ar", {}, 4),
        ("setdlm", {"window": 4, "threshold": 0.05}, 8),
        ("setdlm", {"window": 2}, 5),
        ("bd3lm", {"threshold": 0.5}, 8),
    ],
)
def test_small_cache_runs(sharp_model: Transformer, name: str, kw: dict, capacity: int) -> None:
    prompt, n = PROMPTS[3], 40
    res = generate(
        sharp_model,
        prompt,
        max_new_tokens=n,
        paradigm=make_paradigm(name, mask_id=MASK_ID),
        cache_size=capacity,
        **kw,
    )
    assert len(res.tokens) == n and MASK_ID not in res.tokens
    assert 0 < res.cache_length <= capacity
    assert sorted(p for s in res.steps for p in s) == list(range(3, 3 + n))


class CountingForward:
    def __init__(self, net: nn.Module) -> None:
        self.calls = 0
        self._forward = net.forward

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls += 1
        return self._forward(*args, **kwargs)


@pytest.mark.parametrize(
    ("name", "kw", "capacity"),
    [
        ("setdlm", {"window": 4, "threshold": 0.05}, 6),
        ("bd3lm", {}, 6),
        ("aogpt", {}, 10),
        ("mdlm", {}, 10),
        ("ar", {}, 2),
    ],
)
def test_too_small_cache_fails_before_compute_or_runs(
    sharp_model: Transformer, monkeypatch: pytest.MonkeyPatch, name: str, kw: dict, capacity: int
) -> None:
    """`generate` promises ValueError on bad arguments *before any compute*; a cache too small
    for a forward must either be rejected up front or decoding must complete."""
    counter = CountingForward(sharp_model)
    monkeypatch.setattr(sharp_model, "forward", counter)
    try:
        res = generate(
            sharp_model,
            PROMPTS[1] + [5],
            max_new_tokens=20,
            paradigm=make_paradigm(name, mask_id=MASK_ID),
            cache_size=capacity,
            **kw,
        )
    except ValueError:
        assert counter.calls == 0, f"ValueError after {counter.calls} forward(s)"
    else:
        assert len(res.tokens) == 20
