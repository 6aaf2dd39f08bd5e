"""Self-speculative set decoding (``verify=True``): exactly the W = 1 greedy decode, cached,
recomputed, batched and compiled; drafts that all agree decode several tokens a forward, drafts
that never agree still decode exactly; rejected drafts leave no trace in the cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from decode_checks import assert_same_decode

from setdiff.model import Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm
from setdiff.sampling import static, verify
from setdiff.sampling.loop import GenerateResult, generate, generate_batch

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
VOCAB = 24
PROMPTS = [[1], [1, 5, 7], [1, 5, 7, 9, 11, 13, 15]]
N = 12
PARADIGM = make_paradigm("setdlm", SetDLMConfig(shift=True, set_size=4), mask_id=MASK_ID)
WINDOWS = [2, 4, 8]  # 8 = max_window (2D)


@pytest.fixture(params=[(0, 1.0), (1, 20.0), (2, 8.0)], ids=["s0", "s1-sharp", "s2"])
def net(request: pytest.FixtureRequest, make_tiny_model: Callable[..., Transformer]) -> Transformer:
    seed, head_scale = request.param
    return make_tiny_model(seed=seed, head_scale=head_scale)


def _w1(net: Transformer, prompt: list[int], **kw: Any) -> GenerateResult:
    kw = {"max_new_tokens": N, **kw}
    return generate(net, prompt, paradigm=PARADIGM, window=1, **kw)


def _verify(net: Transformer, prompt: list[int], window: int, **kw: Any) -> GenerateResult:
    """Verify decoding, cached and recomputed: same tokens, steps, NFE; logits to 1e-5 (so the
    cache holds exactly the committed tokens' K/V, none of a rejected draft's)."""
    run = dict(max_new_tokens=N, paradigm=PARADIGM, window=window, verify=True, trace_logits=True)
    a = generate(net, prompt, **run, **kw)
    b = generate(net, prompt, use_cache=False, **run, **kw)
    assert_same_decode(b, a, same_cache=False)
    decoded = sorted(p for step in a.steps for p in step)  # each position once
    assert decoded[: len(a.tokens)] == list(range(len(prompt), len(prompt) + len(a.tokens)))
    assert len(set(decoded)) == len(decoded)
    return a


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("prompt", PROMPTS, ids=len)
def test_verify_is_the_w1_greedy_decode(net: Transformer, prompt: list[int], window: int) -> None:
    out = _verify(net, prompt, window)
    assert out.tokens == _w1(net, prompt).tokens
    assert out.nfe <= N and out.drafts[1] <= out.drafts[0]


@pytest.mark.parametrize("suffix", [[9, 10, 11], [20, 21]])
@pytest.mark.parametrize("prompt", PROMPTS[:2], ids=len)
def test_verify_infilling_is_the_w1_decode(
    net: Transformer, prompt: list[int], suffix: list[int]
) -> None:
    """With a suffix: the first token comes from the frontier query (which sees the suffix),
    not from the prefill's last row (which does not; with prompt [1] and suffix [20, 21] their
    greedy tokens differ for two of the three models)."""
    out = _verify(net, prompt, 4, suffix_ids=suffix)
    assert out.tokens == _w1(net, prompt, suffix_ids=suffix).tokens


@pytest.fixture
def drafts_from(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Swap the draft source for ``pick(W = 1's token, position) -> draft``, per prompt (a
    state is told by its prompt's length)."""

    def swap(
        net: Transformer,
        prompts: list[list[int]],
        pick: Callable[[int, int], int],
        new: list[int] | None = None,
    ) -> None:
        refs = {
            len(prompt): prompt + _w1(net, prompt, max_new_tokens=n).tokens
            for prompt, n in zip(prompts, new or [N] * len(prompts), strict=True)
        }

        def draft(state: Any, positions: list[int], tokens: list[int]) -> list[int]:
            ref = refs[state.gen_start]
            return [pick(ref[p], p) for p in positions]

        monkeypatch.setattr(verify, "draft", draft)

    return swap


def _wrong(token: int) -> int:
    return (token + 1) % VOCAB or 4  # never the token, never [MASK] (3)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("prompt", PROMPTS, ids=len)
def test_perfect_drafts_decode_window_tokens_a_forward(
    net: Transformer, drafts_from: Callable[..., None], prompt: list[int], window: int
) -> None:
    """Drafts equal to W = 1's tokens all agree: W tokens a forward (the W - 1 drafts of the
    previous forward + the bonus), after the first forward's one."""
    expected = _w1(net, prompt).tokens
    drafts_from(net, [prompt], lambda token, _: token)
    out = _verify(net, prompt, window)
    assert out.tokens == expected
    assert out.drafts[0] == out.drafts[1] > 0
    assert [len(s) for s in out.steps[:2]] == [1, min(window, N - 1)]
    assert out.nfe == 1 + -(-(N - 1) // window)


@pytest.mark.parametrize("window", [2, 4])
@pytest.mark.parametrize("prompt", PROMPTS, ids=len)
def test_wrong_drafts_still_decode_exactly(
    net: Transformer, drafts_from: Callable[..., None], prompt: list[int], window: int
) -> None:
    """Drafts that never agree: every one is rejected (its K/V dropped, cached logits still
    equal recomputed ones), one token a forward, the W = 1 tokens."""
    expected = _w1(net, prompt).tokens
    drafts_from(net, [prompt], lambda token, _: _wrong(token))
    out = _verify(net, prompt, window)
    assert out.tokens == expected
    assert out.drafts[0] > 0 and out.drafts[1] == 0
    assert all(len(s) == 1 for s in out.steps) and out.nfe == N


@pytest.mark.parametrize("perfect", [False, True])
def test_stops_fire_on_verified_tokens(
    net: Transformer, drafts_from: Callable[..., None], perfect: bool
) -> None:
    """A stop token fires once verified, never as a draft: wrong drafts that are the stop
    token stop nothing; perfect drafts stop where W = 1 stops (tokens after the stop in the
    same forward are cut). The output ends at W = 1's stop."""
    prompt = PROMPTS[1]
    stop = _w1(net, prompt).tokens[N // 2]
    expected = _w1(net, prompt, stop_ids=[stop])
    assert expected.stopped
    drafts_from(net, [prompt], lambda t, _: t if perfect else (stop if t != stop else _wrong(stop)))
    out = _verify(net, prompt, 4, stop_ids=[stop])
    assert out.stopped and out.tokens == expected.tokens
    assert out.drafts[0] > 0


@pytest.mark.parametrize("window", [2, 4])
def test_stop_ids_as_w1(net: Transformer, window: int) -> None:
    prompt = PROMPTS[2]
    stop = _w1(net, prompt).tokens[N // 3]
    expected = _w1(net, prompt, stop_ids=[stop])
    out = _verify(net, prompt, window, stop_ids=[stop])
    assert out.stopped and out.tokens == expected.tokens


BATCH = [PROMPTS[1], PROMPTS[0], PROMPTS[2]]
BATCH_NEW = [8, 12, 6]


def _batch_rows(net: Transformer, window: int, **kw: Any) -> list[GenerateResult]:
    """Batched verify decoding: each row equals verify alone (tokens, steps, NFE, drafts,
    logits to 1e-5) and W = 1's greedy decode."""
    rows = generate_batch(
        net,
        BATCH,
        max_new_tokens=BATCH_NEW,
        paradigm=PARADIGM,
        window=window,
        verify=True,
        trace_logits=True,
        **kw,
    )
    stops = {k: v for k, v in kw.items() if k == "stop_ids"}
    for prompt, n, row in zip(BATCH, BATCH_NEW, rows, strict=True):
        alone = generate(
            net,
            prompt,
            max_new_tokens=n,
            paradigm=PARADIGM,
            window=window,
            verify=True,
            trace_logits=True,
            **kw,
        )
        assert (row.tokens, row.steps, row.nfe, row.drafts) == (
            alone.tokens,
            alone.steps,
            alone.nfe,
            alone.drafts,
        )
        assert (row.stopped, row.cache_length) == (alone.stopped, alone.cache_length)
        assert row.logits is not None and alone.logits is not None
        for a, b in zip(row.logits, alone.logits, strict=True):
            assert a.shape == b.shape and (a - b).abs().max().item() <= 1e-5
        assert row.tokens == _w1(net, prompt, max_new_tokens=n, **stops).tokens
    return rows


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("window", WINDOWS)
def test_batched_verify_rows_equal_alone(net: Transformer, window: int, use_cache: bool) -> None:
    _batch_rows(net, window, use_cache=use_cache)


@pytest.mark.parametrize("use_cache", [True, False])
def test_batched_ragged_acceptance(
    net: Transformer, drafts_from: Callable[..., None], use_cache: bool
) -> None:
    """Drafts right or wrong by position: each row accepts its own count each forward (the
    cache rows drop different numbers of rejected entries), still W = 1's tokens."""
    drafts_from(net, BATCH, lambda t, p: t if p % 5 else _wrong(t), BATCH_NEW)
    rows = _batch_rows(net, 4, use_cache=use_cache)
    assert all(0 < r.drafts[1] < r.drafts[0] for r in rows)
    assert max(len(s) for s in rows[1].steps) > 1
    assert len({r.nfe for r in rows}) > 1


def test_batched_verify_stops(net: Transformer) -> None:
    stop = _w1(net, BATCH[1], max_new_tokens=BATCH_NEW[1]).tokens[5]
    rows = _batch_rows(net, 4, stop_ids=[stop])
    assert rows[1].stopped


def _compiled_equals_eager(net: Transformer, prompt: list[int], window: int) -> GenerateResult:
    run = dict(max_new_tokens=N, paradigm=PARADIGM, window=window, verify=True, trace_logits=True)
    eager = generate(net, prompt, **run)
    compiled = generate(net, prompt, compile_step=True, **run)
    assert_same_decode(compiled, eager)
    assert compiled.tokens == _w1(net, prompt).tokens
    return compiled


@pytest.mark.parametrize("drafts", ["model", "perfect", "wrong", "mixed"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[2]], ids=len)
def test_static_step_verify(
    monkeypatch: pytest.MonkeyPatch,
    net: Transformer,
    drafts_from: Callable[..., None],
    prompt: list[int],
    window: int,
    drafts: str,
) -> None:
    """compile_step's static shape (`max_step` inputs: the last verified token, <= W - 1
    drafts and W queries), the compiler replaced by the eager model: the eager verify decode,
    rejected entries cropped from the static cache."""
    monkeypatch.setattr(static, "compiled_forward", static.greedy_forward)
    pick = {
        "perfect": lambda t, p: t,
        "wrong": lambda t, p: _wrong(t),
        "mixed": lambda t, p: t if p % 3 else _wrong(t),
    }.get(drafts)
    if pick is not None:
        drafts_from(net, [prompt], pick)
    _compiled_equals_eager(net, prompt, window)


def test_compiled_verify(make_tiny_model: Callable[..., Transformer]) -> None:
    """The real thing: torch.compile of the padded verify step."""
    torch._dynamo.reset()
    _compiled_equals_eager(make_tiny_model(seed=1, head_scale=20.0), PROMPTS[1], 4)


@pytest.mark.parametrize(
    ("config", "options", "match"),
    [
        ({}, {}, "verify needs shifted queries"),
        ({"shift": True}, {"temperature": 1.0}, "verify decodes greedily: temperature"),
        ({"shift": True}, {"threshold": 0.5}, "verify accepts drafts by agreement: threshold"),
        (
            {"shift": True},
            {"cache_size": 15},
            r"verify needs cache_size >= 19 \(the whole decode\)",
        ),
    ],
)
def test_verify_refusals(
    monkeypatch: pytest.MonkeyPatch,
    make_tiny_model: Callable[..., Transformer],
    config: dict,
    options: dict,
    match: str,
) -> None:
    """One clear line naming the option, before any compute, from generate and generate_batch."""
    net = make_tiny_model()
    monkeypatch.setattr(net, "forward", lambda *a, **k: pytest.fail("computed"))
    run = dict(
        max_new_tokens=N,
        paradigm=make_paradigm("setdlm", SetDLMConfig(**config), mask_id=MASK_ID),
        verify=True,
        **options,
    )
    with pytest.raises(ValueError, match=match):
        generate(net, PROMPTS[2], **run)
    with pytest.raises(ValueError, match=match):
        generate_batch(net, [PROMPTS[2]], **run)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_verify_must_be_a_bool(make_tiny_model: Callable[..., Transformer], value: object) -> None:
    paradigm = make_paradigm("setdlm", SetDLMConfig(shift=True), mask_id=MASK_ID)
    with pytest.raises(ValueError, match="verify must be true or false"):
        generate(make_tiny_model(), PROMPTS[2], max_new_tokens=N, paradigm=paradigm, verify=value)
