"""Batched decoding: every row of `generate_batch` equals decoding that prompt alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from setdiff import generate_batch
from setdiff.kv_cache import KVCache
from setdiff.masks import decode_mask
from setdiff.model import Transformer
from setdiff.paradigm import make_paradigm
from setdiff.sampling.engine import fill_holes as batch_fill_holes
from setdiff.sampling.loop import GenerateResult, generate

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
PROMPTS = [[1, 5, 7], [1], [1, 5, 7, 9, 11, 13, 15], [1, 4], [1, 6, 8, 10, 12]]
NEW = [12, 10, 13, 9, 11]

GREEDY = [
    ("ar", {}),
    ("setdlm", {"window": 1, "threshold": "off"}),
    ("setdlm", {"window": 4, "threshold": "off"}),
    ("setdlm", {"window": 4, "threshold": 0.5}),
    ("setdlm", {"window": 2, "threshold": 0.05}),
    ("setdlm", {"window": "all", "threshold": 0.5}),
    ("aogpt", {"order": "random"}),
    ("aogpt", {"order": "confidence"}),
    ("aogpt", {"order": "confidence", "window": 3}),
    ("bd3lm", {}),
    ("bd3lm", {"threshold": 0.5}),
    ("mdlm", {"chunk_size": 4, "threshold": 0.5}),
    ("mdlm", {"chunk_size": 32, "order": "random"}),
]
SAMPLING = {
    "ar": {},
    "setdlm": {"window": 4, "threshold": 0.5},
    "aogpt": {"final_temperature": 0.5},
    "bd3lm": {"threshold": 0.5},
    "mdlm": {"threshold": 0.5, "chunk_size": 8},
}


@pytest.fixture
def sharp_model(make_tiny_model: Callable[..., Transformer]) -> Transformer:
    return make_tiny_model(seed=0, head_scale=20.0)


def _alone(net: Any, paradigm: Any, i: int, prompts: list, new: list, **kw: Any) -> GenerateResult:
    suffixes = kw.pop("suffixes", None)
    seeds = kw.pop("seed", 0)
    seed = seeds[i] if isinstance(seeds, list) else seeds
    suffix = suffixes[i] if suffixes is not None else None
    return generate(
        net,
        prompts[i],
        max_new_tokens=new[i],
        paradigm=paradigm,
        suffix_ids=suffix,
        seed=seed,
        trace_logits=True,
        **kw,
    )


def check_rows(net: Any, name: str, prompts: list, new: list, **kw: Any) -> list[GenerateResult]:
    """Batch vs each row alone: same tokens, steps, NFE, stop, cache length; logits to 1e-5."""
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    batch = generate_batch(
        net, prompts, max_new_tokens=new, paradigm=paradigm, trace_logits=True, **kw
    )
    assert len(batch) == len(prompts)
    for i, row in enumerate(batch):
        alone = _alone(net, paradigm, i, prompts, new, **kw)
        assert row.tokens == alone.tokens, f"row {i}"
        assert row.steps == alone.steps, f"row {i}"
        assert row.nfe == alone.nfe == len(row.logits), f"row {i}"
        assert row.stopped == alone.stopped and row.cache_length == alone.cache_length
        for a, b in zip(row.logits, alone.logits, strict=True):
            assert a.shape == b.shape
            assert (a - b).abs().max().item() <= 1e-5
    return batch


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize(("name", "options"), GREEDY)
def test_greedy_rows_equal_alone(
    sharp_model: Transformer, name: str, options: dict, use_cache: bool
) -> None:
    rows = check_rows(sharp_model, name, PROMPTS, NEW, use_cache=use_cache, **options)
    assert [len(r.tokens) for r in rows] == NEW
    assert len({r.nfe for r in rows}) > 1  # ragged progress: rows end at different steps


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("name", list(SAMPLING))
def test_seeded_sampling_rows_equal_alone(
    make_tiny_model: Callable[..., Transformer], name: str, use_cache: bool
) -> None:
    net = make_tiny_model(seed=1, head_scale=3.0)
    kw = dict(SAMPLING[name], temperature=1.0, top_p=0.9, use_cache=use_cache)
    per_row = check_rows(net, name, PROMPTS, NEW, seed=[7, 8, 9, 10, 11], **kw)
    shared = check_rows(net, name, PROMPTS, NEW, seed=7, **kw)
    assert per_row[0].tokens == shared[0].tokens  # row 0 has seed 7 both times
    same_prompt = check_rows(net, name, [PROMPTS[0]] * 4, [12] * 4, seed=[0, 1, 2, 3], **kw)
    assert len({tuple(r.tokens) for r in same_prompt}) > 1  # each row has its own generator


@pytest.mark.parametrize(("name", "options"), GREEDY)
def test_early_stops(sharp_model: Transformer, name: str, options: dict) -> None:
    # A stop id on which the rows, decoded alone, stop at different lengths (or not at all).
    paradigm = make_paradigm(name, mask_id=MASK_ID)

    def lengths(stop: int) -> list[int | None]:
        out = []
        for p, n in zip(PROMPTS, NEW, strict=True):
            r = generate(
                sharp_model, p, max_new_tokens=n, paradigm=paradigm, stop_ids=[stop], **options
            )
            out.append(len(r.tokens) if r.stopped else None)
        return out

    def ragged(ends: list[int | None]) -> bool:
        return any(n is not None for n in ends) and len(set(ends)) > 1

    vocab = [t for t in range(sharp_model.config.vocab_size) if t != MASK_ID]  # [MASK]: no stop
    stop = next(t for t in vocab if ragged(lengths(t)))
    rows = check_rows(sharp_model, name, PROMPTS, NEW, stop_ids=[stop], **options)
    assert [len(r.tokens) if r.stopped else None for r in rows] == lengths(stop)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("setdlm", {"window": 2, "threshold": 0.5}),
        ("setdlm", {"window": "all", "threshold": "off"}),
        ("aogpt", {}),
        ("aogpt", {"order": "confidence"}),
        ("mdlm", {"chunk_size": 4}),
    ],
)
def test_infilling_rows(
    sharp_model: Transformer, name: str, options: dict, use_cache: bool
) -> None:
    suffixes = [[9, 10, 11], None, [12], None, [9, 9, 10, 10]]
    rows = check_rows(
        sharp_model,
        name,
        PROMPTS,
        [6, 8, 5, 7, 6],
        suffixes=suffixes,
        use_cache=use_cache,
        **options,
    )
    for p, n, r in zip(PROMPTS, [6, 8, 5, 7, 6], rows, strict=True):
        assert sorted(q for step in r.steps for q in step) == list(range(len(p), len(p) + n))


@pytest.mark.parametrize(
    ("name", "options", "capacity"),
    [
        ("ar", {}, 8),
        ("setdlm", {"window": 4, "threshold": 0.5}, 11),
        ("aogpt", {"window": 4}, 14),
        ("bd3lm", {"threshold": 0.5}, 11),
    ],
)
def test_small_cache_rows_equal_alone(
    sharp_model: Transformer, name: str, options: dict, capacity: int
) -> None:
    rows = check_rows(sharp_model, name, PROMPTS, NEW, cache_size=capacity, **options)
    assert all(r.cache_length <= capacity for r in rows)


@pytest.mark.parametrize(("name", "options"), GREEDY)
def test_batch_of_one_is_generate(sharp_model: Transformer, name: str, options: dict) -> None:
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    kw = dict(max_new_tokens=12, paradigm=paradigm, trace_logits=True, **options)
    (row,) = generate_batch(sharp_model, [PROMPTS[2]], **kw)
    alone = generate(sharp_model, PROMPTS[2], **kw)
    assert row.tokens == alone.tokens and row.steps == alone.steps and row.nfe == alone.nfe
    assert all(torch.equal(a, b) for a, b in zip(row.logits, alone.logits, strict=True))


class _Counting(torch.nn.Module):
    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner, self.config, self.shapes = inner, inner.config, []

    def forward(self, tokens, positions, mask=None, cache=None):  # noqa: ANN001, ANN201
        self.shapes.append(tuple(tokens.shape))
        return self.inner(tokens, positions, mask, cache)


@pytest.mark.parametrize("name", ["ar", "setdlm", "mdlm"])
def test_finished_rows_leave_the_batch(sharp_model: Transformer, name: str) -> None:
    net = _Counting(sharp_model)
    rows = generate_batch(
        net,
        [[1], [1, 5], [1, 5, 7]],
        max_new_tokens=[2, 6, 4],
        paradigm=make_paradigm(name, mask_id=MASK_ID),
    )
    sizes = [b for b, _ in net.shapes]
    assert sizes[0] == 3 and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True)
    assert len(net.shapes) == max(r.nfe for r in rows)
    assert sum(sizes) == sum(r.nfe for r in rows)  # every row forwards only while it decodes


def test_ragged_cache_stages_each_row_at_its_own_offset() -> None:
    cache = KVCache(n_layer=1, capacities=[8, 8], slack=2, n_kv_head=1, head_dim=2)
    cache.lengths = [1, 3]
    cache.prepare(2)
    new = torch.arange(8, dtype=torch.float).reshape(2, 1, 2, 2) + 1
    k, _ = cache.stage(0, new, new)
    assert k.shape == (2, 1, 5, 2)
    assert torch.equal(k[0, 0, 1:3], new[0, 0]) and torch.equal(k[1, 0, 3:5], new[1, 0])
    cache.commit(1, 0)
    cache.commit(2, 1)
    cache.end_forward()
    assert cache.lengths == [2, 5]
    cache.keep_rows([1])
    assert cache.lengths == [5] and torch.equal(cache.k_NBGCE[0, 0, 0, 3:5], new[1, 0])
    kept = cache.k_NBGCE[0, 0, 0, 2:5].clone()  # the newest three of the row's five entries
    assert cache.make_room(5, 0) == 2 and cache.lengths == [3]
    assert torch.equal(cache.k_NBGCE[0, 0, 0, :3], kept)


@pytest.fixture
def no_compute(sharp_model: Transformer, monkeypatch: pytest.MonkeyPatch) -> Transformer:
    def boom(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("compute ran before argument validation")

    monkeypatch.setattr(sharp_model, "forward", boom)
    return sharp_model


@pytest.mark.parametrize(
    ("name", "prompts", "kwargs", "match"),
    [
        ("ar", [], {}, "prompts must hold at least one"),
        ("ar", [1, 5, 7], {}, "not one prompt"),
        ("ar", "1 5 7", {}, "prompts"),
        ("ar", [[1, 5], [1, 99]], {}, r"prompts\[1\]: token id 99"),
        ("ar", [[1, 5], "15"], {}, r"prompts\[1\] must be token ids"),
        ("setdlm", [[1, 5], []], {}, r"prompts\[1\] must hold at least one token"),
        ("ar", [[1], [1]], {"max_new_tokens": [4]}, "max_new_tokens must be an int or hold one"),
        ("ar", [[1], [1]], {"max_new_tokens": [4, 0]}, r"max_new_tokens\[1\] must be >= 1"),
        ("ar", [[1], [1]], {"max_new_tokens": [4, 2.5]}, r"max_new_tokens\[1\] must be an int"),
        ("ar", [[1], [1]], {"seed": [0, "x"]}, r"seed\[1\] must be an integer"),
        ("ar", [[1], [1]], {"suffixes": [None]}, "suffixes must hold one entry per prompt"),
        ("ar", [[1], [1]], {"suffixes": [None, [5]]}, r"suffixes\[1\] \(infilling\)"),
        ("ar", [[1], [1] * 126], {}, r"max_seq_len=128 \(prompts\[1\]\)"),
        ("setdlm", [[1], [1]], {"window": 0}, "window"),
        ("setdlm", [[1], [1]], {"cache_size": 2}, "cache_size"),
        ("bd3lm", [[1], [1]], {"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_arguments(
    no_compute: Transformer, name: str, prompts: Any, kwargs: dict, match: str
) -> None:
    args: dict[str, Any] = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        generate_batch(no_compute, prompts, paradigm=make_paradigm(name, mask_id=MASK_ID), **args)
    assert "\n" not in str(err.value)


class _Letters:
    """A tokenizer stand-in: id i decodes to the letter chr(97 + i)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)


@pytest.mark.parametrize(
    ("name", "options"), [("ar", {}), ("setdlm", {"window": 4, "threshold": 0.5}), ("bd3lm", {})]
)
def test_stop_strings_rows_equal_alone(sharp_model: Transformer, name: str, options: dict) -> None:
    from pathlib import Path

    from setdiff.artifacts import LoadedModel

    model = LoadedModel(sharp_model, make_paradigm(name, mask_id=MASK_ID), _Letters(), Path())
    free = [
        generate(model, p, max_new_tokens=n, **options) for p, n in zip(PROMPTS, NEW, strict=True)
    ]
    texts = [_Letters().decode(r.tokens) for r in free]
    bigrams = sorted({t[i : i + 2] for t in texts for i in range(len(t) - 1)})
    stop = next(b for b in bigrams if 0 < sum(b in t for t in texts) < len(texts))
    rows = generate_batch(model, PROMPTS, max_new_tokens=NEW, stop_strings=[stop], **options)
    for p, n, row in zip(PROMPTS, NEW, rows, strict=True):
        alone = generate(model, p, max_new_tokens=n, stop_strings=[stop], **options)
        assert (row.tokens, row.steps, row.nfe, row.stopped) == (
            alone.tokens,
            alone.steps,
            alone.nfe,
            alone.stopped,
        )
    assert any(r.stopped for r in rows) and not all(r.stopped for r in rows)


def _shifted(name: str) -> Any:
    from setdiff.paradigm import PARADIGMS

    config_cls, _ = PARADIGMS[name]
    return make_paradigm(name, config_cls(shift=True), mask_id=MASK_ID)


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize(("name", "options"), [*GREEDY[1:6], GREEDY[7], GREEDY[9], GREEDY[11]])
def test_batched_inputs_are_each_rows_own(
    sharp_model: Transformer,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    options: dict,
    use_cache: bool,
    shift: bool,
) -> None:
    # Every forward's batched inputs, row by row, are those of that row alone, built by brute
    # force from `decode_mask` and the shift rule; padding inputs see only their own slot; no mask
    # only when every row's would be all True.
    import setdiff.sampling.engine as engine_module

    built, checked = engine_module.batch_inputs, []

    def spy(states, plans, offsets, *, shift, **extra):  # noqa: ANN001, ANN003, ANN202
        inputs = built(states, plans, offsets, shift=shift, **extra)
        tokens, positions, mask = inputs.tokens, inputs.positions, inputs.mask
        for r, (state, plan) in enumerate(zip(states, plans, strict=True)):
            n_cached = offsets[r] if offsets is not None else None
            want_tokens, want_positions, want_mask = _row_inputs(state, plan, n_cached, shift)
            n, k = len(want_tokens), want_mask.shape[1]
            assert inputs.outputs[r] == (n - len(plan.commit) - len(plan.queries), n)
            assert tokens[r, :n].tolist() == want_tokens
            assert positions[r, :n].tolist() == want_positions
            if mask is None:
                assert want_mask.all() and n == tokens.shape[1]
                continue
            assert torch.equal(mask[r, :n, :k], want_mask) and not mask[r, :n, k:].any()
            for t in range(n, tokens.shape[1]):
                assert mask[r, t].nonzero().flatten().tolist() == [(n_cached or 0) + t]
            checked.append(n < tokens.shape[1])
        return inputs

    monkeypatch.setattr(engine_module, "batch_inputs", spy)
    paradigm = _shifted(name) if shift else make_paradigm(name, mask_id=MASK_ID)
    generate_batch(
        sharp_model, PROMPTS, max_new_tokens=NEW, paradigm=paradigm, use_cache=use_cache, **options
    )
    assert any(checked)  # some forward had padding inputs


def _row_inputs(
    state: Any, plan: Any, n_cached: int | None, shift: bool
) -> tuple[list[int], list[int], torch.Tensor]:
    """One row's (tokens, positions, mask) by the rules' definitions: fed committed tokens then
    queries; mask rows from `decode_mask` over its keys; a shifted query of p at p - 1, blind to
    p - 1's committed key."""
    n = state.n_committed
    n_fed = n if n_cached is None else len(plan.commit)
    n_keys = n if n_cached is None else n_cached + n_fed
    m, attend = len(plan.queries), plan.query_attend
    if not isinstance(attend, torch.Tensor):  # "self" or "all"
        attend = torch.eye(m, dtype=torch.bool) if attend == "self" else torch.ones(m, m).bool()
    mask = decode_mask(torch.tensor(state.group_of[n - n_keys : n]), n_fed, attend)
    queries = [max(q - 1, 0) for q in plan.queries] if shift else list(plan.queries)
    positions = state.order[n - n_fed : n] + queries
    if shift and m:
        keys = torch.tensor(state.order[n - n_keys : n])
        mask[n_fed:, :n_keys] &= keys != (torch.tensor(plan.queries) - 1)[:, None]
    return [state.canvas[p] for p in positions], positions, mask


def test_fill_holes_moves_rows_from_the_end() -> None:
    assert batch_fill_holes(5, [1]) == [0, 4, 2, 3]
    assert batch_fill_holes(5, [0, 4]) == [3, 1, 2]
    assert batch_fill_holes(4, [1, 2]) == [0, 3]
    assert batch_fill_holes(3, [0, 1, 2]) == []
    assert batch_fill_holes(3, []) == [0, 1, 2]


@pytest.mark.parametrize("rows", [[0, 4, 2, 3], [3, 1, 2], [2, 0, 1], [4, 3]])
def test_keep_rows_equals_a_gather(rows: list[int]) -> None:
    # The in-place path (holes filled from the end) and the general gather keep the same rows.
    cache = KVCache(n_layer=2, capacities=[6, 7, 8, 9, 10], slack=1, n_kv_head=1, head_dim=2)
    cache.k_NBGCE.normal_()
    cache.v_NBGCE.normal_()
    cache.lengths = [1, 2, 3, 4, 5]
    want = [(cache.k_NBGCE[:, r].clone(), cache.v_NBGCE[:, r].clone()) for r in rows]
    cache.keep_rows(rows)
    assert cache.lengths == [[1, 2, 3, 4, 5][r] for r in rows]
    assert cache.capacities == [[6, 7, 8, 9, 10][r] for r in rows]
    assert cache.k_NBGCE.shape[1] == len(rows)
    for i, (k, v) in enumerate(want):
        assert torch.equal(cache.k_NBGCE[:, i], k) and torch.equal(cache.v_NBGCE[:, i], v)


# ---------------------------------------------------------------------------------------------
# decode arguments that would give a silent wrong result: refused by both entry points, in one
# line naming the argument, before any forward


def _decode(entry: str, model: Any, prompt: list[int], suffix: list[int] | None, **kw: Any) -> Any:
    """`generate` on one prompt, or `generate_batch` on it as a batch of one."""
    if entry == "generate":
        return generate(model, prompt, max_new_tokens=4, suffix_ids=suffix, **kw)
    return generate_batch(model, [prompt], max_new_tokens=4, suffixes=[suffix], **kw)


PARADIGMS = ["ar", "mdlm", "bd3lm", "aogpt", "setdlm"]
INF, NAN = float("inf"), float("nan")
BAD_OPTIONS = [
    *[(name, {"temperature": t}, "temperature") for name in PARADIGMS for t in (INF, NAN, True)],
    *[(name, {"top_p": p}, "top_p") for name in PARADIGMS for p in (INF, NAN, True)],
    *[(n, {"threshold": t}, "threshold") for n in ("mdlm", "bd3lm", "setdlm") for t in (INF, True)],
    ("setdlm", {"window": True}, "window"),
    ("aogpt", {"window": True}, "window"),
    ("aogpt", {"final_temperature": INF}, "final_temperature"),
    ("aogpt", {"final_temperature": True}, "final_temperature"),
    ("mdlm", {"chunk_size": True}, "chunk_size"),
    ("mdlm", {"chunk_size": "4"}, "chunk_size"),
    ("setdlm", {"cache_size": True}, "cache_size"),
    ("setdlm", {"cache_size": 64.0}, "cache_size"),
    *[
        (name, {"stop_ids": [24]}, r"stop_ids: token id 24 is outside \[0, 24\)")
        for name in PARADIGMS
    ],
    *[(name, {"stop_ids": [5, -1]}, r"stop_ids: token id -1") for name in PARADIGMS],
    *[
        (name, {"stop_ids": [5, MASK_ID]}, r"stop_ids\[1\] is the \[MASK\] id 3")
        for name in PARADIGMS
    ],
]


@pytest.mark.parametrize("entry", ["generate", "generate_batch"])
@pytest.mark.parametrize(("name", "kwargs", "match"), BAD_OPTIONS)
def test_bad_decode_options_are_refused_before_any_forward(
    no_compute: Transformer, entry: str, name: str, kwargs: dict, match: str
) -> None:
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    with pytest.raises(ValueError, match=match) as err:
        _decode(entry, no_compute, [1, 5], None, paradigm=paradigm, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("entry", ["generate", "generate_batch"])
@pytest.mark.parametrize("name", PARADIGMS)
def test_an_empty_stop_string_is_refused(no_compute: Transformer, entry: str, name: str) -> None:
    # "" is in every text: it would stop after the first token
    from pathlib import Path

    from setdiff.artifacts import LoadedModel

    model = LoadedModel(no_compute, make_paradigm(name, mask_id=MASK_ID), _Letters(), Path())
    with pytest.raises(ValueError, match=r"stop_strings\[1\] is empty"):
        _decode(entry, model, [1, 5], None, stop_strings=["ab", ""])


@pytest.mark.parametrize("entry", ["generate", "generate_batch"])
@pytest.mark.parametrize("name", PARADIGMS)
def test_a_mask_id_in_the_given_tokens_is_refused(
    no_compute: Transformer, entry: str, name: str
) -> None:
    # a [MASK] in the prompt (or the suffix) would be read as context, not decoded
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    prompt_name = "prompt_ids" if entry == "generate" else r"prompts\[0\]"
    with pytest.raises(ValueError, match=prompt_name + r"\[2\] is the \[MASK\] id 3"):
        _decode(entry, no_compute, [1, 5, MASK_ID, 7], None, paradigm=paradigm)
    if paradigm.can_infill:
        suffix_name = "suffix_ids" if entry == "generate" else r"suffixes\[0\]"
        with pytest.raises(ValueError, match=suffix_name + r"\[0\] is the \[MASK\] id 3"):
            _decode(entry, no_compute, [1, 5], [MASK_ID, 7], paradigm=paradigm)


@pytest.mark.parametrize("entry", ["generate", "generate_batch"])
@pytest.mark.parametrize("name", ["mdlm", "aogpt", "setdlm"])
def test_infilling_still_decodes_the_slots_between_prompt_and_suffix(
    sharp_model: Transformer, entry: str, name: str
) -> None:
    # the slots to fill are the masked ones between the given prompt and suffix
    paradigm = make_paradigm(name, mask_id=MASK_ID)
    result = _decode(entry, sharp_model, [1, 5], [7, 9], paradigm=paradigm)
    (result,) = [result] if entry == "generate" else result
    assert len(result.tokens) == 4 and MASK_ID not in result.tokens
