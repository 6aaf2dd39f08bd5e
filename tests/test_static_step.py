"""The static-shape decode step (`generate(..., compile_step=True)`): padded, over the whole
cache, compiled; it must decode what the eager step decodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from setdiff.kv_cache import KVCache
from setdiff.model import Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm
from setdiff.sampling import static
from setdiff.sampling.logits import greedy_table
from setdiff.sampling.loop import GenerateResult, generate

MASK_ID = 3

CASES = [
    ("ar", {}, {}),
    ("ar", {}, {"temperature": 1.0, "seed": 3}),
    ("setdlm", {}, {"window": 4}),
    ("setdlm", {}, {"window": 4, "threshold": 0.1}),
    ("setdlm", {}, {"window": 3, "temperature": 1.0, "top_p": 0.9, "seed": 5}),
    ("setdlm", {"shift": True}, {"window": 4, "threshold": 0.1}),
    ("setdlm", {}, {"window": 4, "threshold": 0.1, "suffix_ids": [7, 2]}),  # infilling
    ("setdlm", {}, {"window": 4, "cache_size": 30}),  # entries dropped from the left
    ("setdlm", {}, {"window": 4, "temperature": 1.0, "seed": 5, "stop_ids": [19]}),  # an early stop
    ("bd3lm", {}, {"threshold": 0.1}),
    ("aogpt", {}, {"window": 4, "order": "confidence"}),
    ("aogpt", {}, {"order": "random", "seed": 2}),
]


@pytest.fixture
def net(make_tiny_model: Callable[..., Transformer]) -> Transformer:
    return make_tiny_model(seed=1, head_scale=8.0)  # confident enough to accept several tokens


def _pair(
    net: Transformer, name: str, config: dict[str, Any], opts: dict[str, Any], prompt: list[int]
) -> Any:
    paradigm = make_paradigm(name, SetDLMConfig(**config) if config else None, mask_id=MASK_ID)
    run = dict(max_new_tokens=20, paradigm=paradigm, trace_logits=True, **opts)
    return generate(net, prompt, **run), generate(net, prompt, compile_step=True, **run)


def _same(eager: GenerateResult, static_: GenerateResult) -> None:
    assert static_.tokens == eager.tokens
    assert (static_.nfe, static_.steps, static_.stopped) == (eager.nfe, eager.steps, eager.stopped)
    assert static_.cache_length == eager.cache_length
    assert eager.logits is not None and static_.logits is not None
    for a, b in zip(eager.logits, static_.logits, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("name", "config", "opts"), CASES)
@pytest.mark.parametrize("prompt", [[1], [1, 5, 7, 9, 11, 13, 15]])
def test_padded_step_equals_eager(
    monkeypatch: pytest.MonkeyPatch,
    net: Transformer,
    name: str,
    config: dict[str, Any],
    opts: dict[str, Any],
    prompt: list[int],
) -> None:
    """The static shape alone (padding rows, attention over every slot, staging at tensor
    slots), with the compiler replaced by the eager model: same decode, logits to rounding."""
    monkeypatch.setattr(static, "compiled_forward", static.greedy_forward)
    eager, static_ = _pair(net, name, config, opts, prompt)
    _same(eager, static_)


def test_the_cases_exercise_what_they_claim(net: Transformer) -> None:
    """Multi-token steps, an early stop, entries dropped from the left."""
    eager, _ = _pair(net, "setdlm", {}, {"window": 4, "threshold": 0.1}, [1, 5, 7])
    assert eager.nfe < 15
    sampled = {"window": 4, "temperature": 1.0, "seed": 5, "stop_ids": [19]}
    eager, _ = _pair(net, "setdlm", {}, sampled, [1, 5, 7])
    assert eager.stopped
    eager, _ = _pair(net, "setdlm", {}, {"window": 4, "cache_size": 30}, [1, 5, 7, 9, 11, 13, 15])
    assert eager.cache_length < 7 + 20


@pytest.mark.parametrize(
    ("name", "config", "opts"),
    [
        ("ar", {}, {}),
        ("ar", {}, {"draft_tokens": 2}),  # speculative: the draft model is the model itself
        ("setdlm", {}, {"window": 4, "threshold": 0.1}),
        ("setdlm", {"shift": True}, {"window": 4, "verify": True}),
    ],
)
def test_greedy_choices_come_from_the_captured_step(
    net: Transformer,
    name: str,
    config: dict[str, Any],
    opts: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy decodes (verify's checks included) read the step's own choices
    (`StaticStep.table`, computed with the forward) instead of choosing from the logits again,
    as the eager engine does after every forward; the decode is the eager one."""
    import setdiff.sampling.engine as engine

    monkeypatch.setattr(static, "compiled_forward", static.greedy_forward)
    paradigm = make_paradigm(name, SetDLMConfig(**config) if config else None, mask_id=MASK_ID)
    if "draft_tokens" in opts:
        opts = {**opts, "draft": net}
    run = dict(max_new_tokens=20, paradigm=paradigm, trace_logits=True, **opts)
    made: list[Any] = []
    monkeypatch.setattr(engine, "greedy_table", lambda *a: made.append(a) or greedy_table(*a))
    eager = generate(net, [1], **run)
    assert len(made) == eager.nfe  # the eager engine makes a table after every forward
    made.clear()
    _same(eager, generate(net, [1], compile_step=True, **run))
    assert made == []  # every forward (the prefill padded too) chose in the step


def test_compiled_step_equals_eager_and_compiles_once(net: Transformer) -> None:
    """The real thing: torch.compile of the padded step; a second decode reuses the graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    eager, compiled = _pair(net, "setdlm", {}, {"window": 4, "threshold": 0.1}, [1, 5, 7])
    _same(eager, compiled)
    graphs = counters["stats"]["unique_graphs"]
    eager, compiled = _pair(net, "setdlm", {}, {"window": 4, "threshold": 0.1}, [1, 5, 7, 9])
    _same(eager, compiled)
    assert counters["stats"]["unique_graphs"] == graphs


def test_static_cache_stages_at_its_slots(net: Transformer) -> None:
    cache = KVCache.for_model(net, 10, static=True)
    cache.lengths = [3]
    cache.prepare(4)
    assert cache.staged == 4
    k = torch.ones(1, net.config.n_kv_head, 4, net.config.head_dim)
    keys, _ = cache.stage(0, k, 2 * k)
    assert keys.shape[2] == 10  # every slot, for a static shape
    assert keys[0, 0, 3:7].eq(1).all() and keys[0, 0, :3].eq(0).all()
    assert keys[0, 0, 7:].eq(0).all()
    cache.commit(2)
    assert cache.length == 5
    with pytest.raises(ValueError, match="cache overflow"):
        cache.prepare(6)
    bucketed = KVCache.for_model(net, 10, slack=3, bucket=8, static=True)
    assert (bucketed.capacities, bucketed.slot_count) == ([10], 16)


@pytest.mark.parametrize(
    ("name", "opts", "match"),
    [
        ("setdlm", {"use_cache": False}, "compile_step needs the KV cache: drop use_cache=False"),
        ("mdlm", {}, "compile_step needs the KV cache, and mdlm decodes without one"),
    ],
)
def test_compile_step_needs_a_cache(
    net: Transformer, name: str, opts: dict[str, Any], match: str
) -> None:
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    with pytest.raises(ValueError, match=match):
        generate(net, [1], max_new_tokens=4, paradigm=paradigm, compile_step=True, **opts)
