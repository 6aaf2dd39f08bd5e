"""`generate` and `generate_batch`: one prompt, or many, through the decode engine
(`setdiff.sampling.engine`). Both validate everything before any compute, build the paradigm's
policy and the cache, and run the engine.

The engine knows models through `Decodable` (a backbone, its paradigm, its tokenizer), which
`setdiff.artifacts.LoadedModel` satisfies: sampling sits below artifacts and never imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Unpack, runtime_checkable

import torch

from setdiff.arguments import as_int, as_sequence, per_row
from setdiff.kv_cache import KVCache
from setdiff.sampling.draft_model import DraftModel
from setdiff.sampling.engine import GenerateResult, Lane, Stopper, run
from setdiff.sampling.policies import (
    ARPolicy,
    DecodeContext,
    DecodeOptions,
    DecodePolicy,
    SetPolicy,
    decode_policy,
)
from setdiff.sampling.state import DecodeState
from setdiff.sampling.static import STATIC_BUCKET, StaticStep

if TYPE_CHECKING:
    from setdiff.model import Transformer
    from setdiff.paradigm import Paradigm
    from setdiff.tokenizer import Tokenizer


@runtime_checkable
class Decodable(Protocol):
    """A model ready to decode: its backbone, its paradigm and (when saved) its tokenizer.

    `setdiff.artifacts.LoadedModel` is one; a bare `Transformer` goes with ``paradigm=``."""

    @property
    def net(self) -> Transformer: ...

    @property
    def paradigm(self) -> Paradigm: ...

    @property
    def tokenizer(self) -> Tokenizer | None: ...


def generate(
    model: Decodable | Transformer,
    prompt_ids: list[int] | torch.Tensor,
    *,
    max_new_tokens: int,
    paradigm: Paradigm | None = None,
    suffix_ids: list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
    seed: int = 0,
    stop_ids: list[int] | tuple[int, ...] = (),
    stop_strings: list[str] | tuple[str, ...] = (),
    cache_size: int | None = None,
    trace_logits: bool = False,
    compile_step: bool = False,
    draft: Decodable | Transformer | None = None,
    **policy_options: Unpack[DecodeOptions],
) -> GenerateResult:
    """Decode `max_new_tokens` slots after `prompt_ids` with the paradigm's sampler.

    Args:
        model: a `Decodable`, e.g. a `LoadedModel` (from `setdiff.load_model`), or a
            `Transformer` with `paradigm`.
        prompt_ids: context token ids (include BOS if the model was trained with it).
        max_new_tokens: slots to generate (the infilling span when `suffix_ids` is given).
        paradigm: the paradigm object when `model` is a bare `Transformer`.
        suffix_ids: right context for infilling (setdlm, aogpt, mdlm).
        use_cache: False = recompute every forward from scratch (for checks and benchmarks).
            MDLM has no cache: every forward sees the whole canvas either way.
        seed: seeds the sampler's generator (sampling and random orders).
        stop_ids: stop once one of these is decoded with everything before it decoded.
        stop_strings: stop once the decoded prefix contains one of these (needs the model's
            tokenizer); the output ends with the token that completes the string.
        cache_size: KV-cache capacity; entries beyond it are dropped from the left.
        trace_logits: keep every forward's query logits (for equivalence checks).
        compile_step: pad every forward of at most the policy's step size (`max_step`
            inputs: every forward after the prefill) to that one static shape over every slot
            of the cache, and run it through ``torch.compile`` (CUDA graphs on CUDA); see
            `setdiff.sampling.static`. Needs the KV cache. The first call for a model, step
            size and cache bucket compiles (seconds); the logits equal the eager ones up to
            float rounding.
        draft: speculative decoding of an ar `model`: a small ar model (a `Decodable`, or a
            `Transformer` taken to be ar) of the same vocabulary proposes ``draft_tokens`` (k)
            tokens greedily (with its own KV cache), and each forward of `model` checks them:
            the output is exactly the greedy decode, in fewer forwards of `model` when drafts
            agree (`setdiff.sampling.verify`). Greedy only; needs ``draft_tokens=k``.
        **policy_options: the paradigm's decode options (`DecodeOptions`), e.g. ``window``,
            ``threshold`` (a float or "off"), ``temperature``, ``top_p``, ``verify`` (see
            `setdiff.sampling.policies`); parsed once, into the paradigm's policy.
    Raises:
        ValueError: on any bad argument, before any compute: e.g. text where token ids are
            expected, a token id outside [0, vocab_size), the [MASK] id in the prompt, suffix
            or stop ids, an empty stop string, a lone str or int where a list is expected, a
            non-integer `max_new_tokens` or `seed`, a bool or non-finite number as a decode
            option.
    """
    rows = [(prompt_ids, suffix_ids, max_new_tokens, seed)]
    args = (stop_ids, stop_strings, cache_size, use_cache, trace_logits, policy_options)
    return _decode(model, paradigm, rows, *args, compile_step=compile_step, draft=draft)[0]


def generate_batch(
    model: Decodable | Transformer,
    prompts: Sequence[list[int] | torch.Tensor],
    *,
    max_new_tokens: int | Sequence[int],
    paradigm: Paradigm | None = None,
    suffixes: Sequence[list[int] | torch.Tensor | None] | None = None,
    use_cache: bool = True,
    seed: int | Sequence[int] = 0,
    stop_ids: list[int] | tuple[int, ...] = (),
    stop_strings: list[str] | tuple[str, ...] = (),
    cache_size: int | None = None,
    trace_logits: bool = False,
    **policy_options: Unpack[DecodeOptions],
) -> list[GenerateResult]:
    """Decode every prompt of `prompts` in one batch; one `GenerateResult` per row, in order.

    Row i equals ``generate(model, prompts[i], max_new_tokens=..., suffix_ids=suffixes[i],
    seed=seed_i, ...)``: the same tokens, steps, NFE and stop, as each row decodes exactly the
    forwards it would decode alone, in the same order, with the same generator draws (the logits
    agree to float rounding, as cached and recomputed logits do). The arguments mean the same,
    per row where a sequence is given (`max_new_tokens`, `seed`; `suffixes`: None or one right
    context or None per row). ``forward_seconds`` is the wall time of the batched forwards the
    row took part in (shared with the other rows of those forwards).

    Raises:
        ValueError: on any bad argument, before any compute, naming the row (``prompts[2]``).
    """
    prompts = as_sequence(prompts, "prompts", "prompts (lists of token ids)")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    if isinstance(prompts[0], int) and not isinstance(prompts[0], bool):
        raise ValueError("prompts must be a list of prompts (lists of token ids), not one prompt")
    B = len(prompts)
    suffix_rows = [None] * B if suffixes is None else as_sequence(suffixes, "suffixes", "suffixes")
    if len(suffix_rows) != B:
        raise ValueError(f"suffixes must hold one entry per prompt ({B}), got {len(suffix_rows)}")
    rows = zip(
        prompts,
        suffix_rows,
        per_row(max_new_tokens, B, "max_new_tokens"),
        per_row(seed, B, "seed"),
        strict=True,
    )
    args = (stop_ids, stop_strings, cache_size, use_cache, trace_logits, policy_options)
    return _decode(model, paradigm, list(rows), *args, batch=True)


def _decode(
    model: Decodable | Transformer,
    paradigm: Paradigm | None,
    rows: list[tuple[Any, Any, Any, Any]],
    stop_ids: Any,
    stop_strings: Any,
    cache_size: int | None,
    use_cache: bool,
    trace_logits: bool,
    options: DecodeOptions,
    *,
    batch: bool = False,
    compile_step: bool = False,
    draft: Decodable | Transformer | None = None,
) -> list[GenerateResult]:
    """Check a decode of `rows` (prompt, suffix, new tokens, seed), then run the engine on it."""
    net, paradigm, tokenizer = _unpack(model, paradigm)
    if net.config.vocab_size > 2**24:  # the greedy table holds token ids as float32
        raise ValueError(f"vocab_size must be <= 2**24 to decode, got {net.config.vocab_size}")
    stops = _as_stops(stop_ids, stop_strings, net, paradigm, tokenizer)
    policy = decode_policy(paradigm, dict(options))
    if batch and isinstance(policy, ARPolicy) and policy.speculative:
        raise ValueError(
            "draft_tokens: speculative decoding with a draft model is batch size 1 only: use "
            "generate(model, prompt, draft=..., draft_tokens=k)"
        )
    made = [
        make_lane(net, paradigm, policy, *row, stops, cache_size, i if batch else None)
        for i, row in enumerate(rows)
    ]
    lanes, total, need = [m[0] for m in made], max(m[1] for m in made), max(m[2] for m in made)
    if draft is not None:
        drafter = DraftModel(_draft_net(draft, net, paradigm, total), total, paradigm.mask_id)
        lanes[0].ctx = dataclasses.replace(lanes[0].ctx, drafter=drafter)
        if not policy.speculative:
            raise ValueError("draft needs draft_tokens=k >= 1: the tokens it proposes per forward")
    elif isinstance(policy, ARPolicy) and policy.speculative:
        raise ValueError("draft_tokens needs draft=: a small ar model of the same vocabulary")
    use_cache = use_cache and policy.uses_cache
    if compile_step and not use_cache:
        name = paradigm.config.name
        why = ": drop use_cache=False" if policy.uses_cache else f", and {name} decodes without one"
        raise ValueError(f"compile_step needs the KV cache{why}")
    cache, step = None, None
    if compile_step:
        n_step = policy.max_step(lanes[0].ctx.n_new)
        capacity = cache_size or total + need
        cache = KVCache.for_model(net, capacity, slack=n_step, bucket=STATIC_BUCKET, static=True)
        step = StaticStep(net, cache, n_step, paradigm.mask_id)
    elif use_cache:
        cache = KVCache.for_model(net, [cache_size or 2 * m[1] for m in made], slack=need)
    with torch.inference_mode():
        run(net, policy, lanes, cache, trace_logits, step)
    return [lane.result for lane in lanes]  # type: ignore[misc]


def make_lane(
    net: Transformer,
    paradigm: Paradigm,
    policy: DecodePolicy,
    prompt_ids: Any,
    suffix_ids: Any,
    max_new_tokens: Any,
    seed: Any,
    stops: Stopper,
    cache_size: int | None,
    row: int | None = None,
) -> tuple[Lane, int, int]:
    """One validated row of a decode (`row`: its index in a batch, named in messages): its
    `Lane` (stopping as `stops` says), its canvas length and the most inputs one of its
    forwards feeds."""
    names = (
        ("prompt_ids", "max_new_tokens", "suffix_ids", "seed")
        if row is None
        else (f"prompts[{row}]", f"max_new_tokens[{row}]", f"suffixes[{row}]", f"seed[{row}]")
    )
    vocab_size, mask_id = net.config.vocab_size, paradigm.mask_id
    prompt = _as_ids(prompt_ids, names[0], vocab_size, mask_id)
    suffix = [] if suffix_ids is None else _as_ids(suffix_ids, names[2], vocab_size, mask_id)
    n_new, seed = as_int(max_new_tokens, names[1]), as_int(seed, names[3])
    total = check_lengths(net, paradigm, prompt, suffix, n_new, names=names[:3])
    need = check_cache_size(policy, prompt, suffix, n_new, cache_size)
    device = next(net.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ctx = DecodeContext(mask_id=mask_id, generator=generator, n_new=n_new)
    state = DecodeState.new(prompt, n_new, suffix, mask_id)
    return Lane(state, ctx, Stopper(stops.ids, stops.strings, stops.tokenizer)), total, need


def _as_stops(
    stop_ids: Any,
    stop_strings: Any,
    net: Transformer,
    paradigm: Paradigm,
    tokenizer: Tokenizer | None,
) -> Stopper:
    """A `Stopper` of validated stops: only stops that can fire (an id in the vocabulary other
    than [MASK], which no policy decodes; a non-empty string, with a tokenizer to read it)."""
    stops = _as_ids(stop_ids, "stop_ids", net.config.vocab_size)
    if paradigm.mask_id in stops:
        raise ValueError(
            f"stop_ids[{stops.index(paradigm.mask_id)}] is the [MASK] id {paradigm.mask_id}, "
            "which is never decoded: it would never stop"
        )
    strings = as_stop_strings(stop_strings)
    if strings and tokenizer is None:
        raise ValueError("stop_strings needs a LoadedModel with a tokenizer")
    return Stopper(set(stops), strings, tokenizer)


def as_stop_strings(stop_strings: Any, name: str = "stop_strings") -> tuple[str, ...]:
    """`stop_strings` as a tuple of non-empty strings (an empty one is in every text, so it
    would stop at the first token); a `ValueError` naming `name` otherwise."""
    strings = as_sequence(stop_strings, name, "strings")
    if not all(isinstance(s, str) for s in strings):
        raise ValueError(f"{name} must hold strings, got {list(strings)!r}")
    if "" in strings:
        raise ValueError(
            f"{name}[{strings.index('')}] is empty: it is in every text, so it would stop at "
            "the first token"
        )
    return tuple(strings)


def check_lengths(
    net: Transformer,
    paradigm: Paradigm,
    prompt: list[int],
    suffix: list[int],
    max_new_tokens: int,
    *,
    names: tuple[str, str, str] = ("prompt_ids", "max_new_tokens", "suffix_ids"),
) -> int:
    """Refuse a decode that does not fit the model or the paradigm; returns its canvas length.

    `names` are the arguments' names in messages (a batch names its rows, e.g. ``prompts[2]``).
    """
    prompt_name, new_name, suffix_name = names
    if max_new_tokens < 1:
        raise ValueError(f"{new_name} must be >= 1, got {max_new_tokens}")
    total = len(prompt) + max_new_tokens + len(suffix)
    if total > net.config.max_seq_len:
        raise ValueError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + suffix ({len(suffix)}) "
            f"= {total} exceeds the model context max_seq_len={net.config.max_seq_len}"
            + ("" if prompt_name == "prompt_ids" else f" ({prompt_name})")
        )
    if not prompt and paradigm.needs_prompt:
        raise ValueError(f"{prompt_name} must hold at least one token (e.g. BOS)")
    if suffix and not paradigm.can_infill:
        raise ValueError(f"{suffix_name} (infilling) is not supported by {paradigm.config.name}")
    return total


def check_cache_size(
    policy: DecodePolicy,
    prompt: list[int],
    suffix: list[int],
    max_new_tokens: int,
    cache_size: int | None,
) -> int:
    """The most inputs one forward of this decode feeds; refuses a cache too small for it (or,
    for ``verify``, one that would drop entries: the decode would no longer be W = 1's)."""
    need = policy.max_forward(len(prompt) + len(suffix), max_new_tokens)
    if cache_size is not None and as_int(cache_size, "cache_size") < need:
        raise ValueError(
            f"cache_size={cache_size} cannot hold one forward of this decode ({need} inputs)"
        )
    total = len(prompt) + max_new_tokens + len(suffix)
    if policy.speculative and (cache_size or total) < total:
        what = "verify" if isinstance(policy, SetPolicy) else "speculative decoding (draft)"
        raise ValueError(
            f"{what} needs cache_size >= {total} (the whole decode), got {cache_size}: "
            "entries dropped from the left would change the decode"
        )
    return need


def _draft_net(
    draft: Decodable | Transformer, net: Transformer, paradigm: Paradigm, total: int
) -> Transformer:
    """The backbone of a valid `draft` model for `net` (an ar model of the same vocabulary)."""
    if paradigm.config.name != "ar":
        raise ValueError(
            f"draft (speculative decoding) needs an ar model, got a {paradigm.config.name} model"
            + (" (its own drafts: verify=True)" if paradigm.config.name == "setdlm" else "")
        )
    if isinstance(draft, Decodable):
        if draft.paradigm.config.name != "ar":
            raise ValueError(f"draft must be an ar model, got a {draft.paradigm.config.name} model")
        draft = draft.net
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
        raise ValueError(f"draft must be a LoadedModel or Transformer, got {type(draft).__name__}")
    if draft.config.vocab_size != net.config.vocab_size:
        raise ValueError(
            f"draft has vocab_size {draft.config.vocab_size}, the model "
            f"{net.config.vocab_size}: a draft model must share the model's vocabulary"
        )
    if draft.config.max_seq_len < total:
        raise ValueError(
            f"draft: its max_seq_len={draft.config.max_seq_len} cannot hold this decode ({total} "
            "tokens)"
        )
    return draft


def _unpack(
    model: Decodable | Transformer, paradigm: Paradigm | None
) -> tuple[Transformer, Paradigm, Tokenizer | None]:
    """The backbone, paradigm (`paradigm` overrides the model's own) and tokenizer to decode."""
    if isinstance(model, Decodable):
        return model.net, paradigm if paradigm is not None else model.paradigm, model.tokenizer
    if paradigm is None:
        raise ValueError("paradigm: pass a LoadedModel or paradigm=make_paradigm(...)")
    return model, paradigm, None


def _as_ids(ids: Any, name: str, vocab_size: int, mask_id: int | None = None) -> list[int]:
    """`ids` as a list of token ids in [0, vocab_size) (given tokens: without `mask_id`, which
    would be read as context, not decoded); a `ValueError` naming `name` otherwise."""
    if isinstance(ids, str | bytes):
        raise ValueError(
            f"{name} must be token ids, got the text {ids!r}: encode it first, e.g. "
            f"[tok.bos_id] + tok.encode(text) with tok = model.tokenizer"
        )
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D (batch size 1), got shape {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got a {ids.dtype} tensor")
        ids = ids.tolist()
    out = [as_int(i, f"{name}[{n}]") for n, i in enumerate(as_sequence(ids, name, "token ids"))]
    outside = [i for i in out if not 0 <= i < vocab_size]
    if outside:
        raise ValueError(
            f"{name}: token id {outside[0]} is outside [0, {vocab_size}), the model's vocabulary"
        )
    if mask_id is not None and mask_id in out:
        raise ValueError(
            f"{name}[{out.index(mask_id)}] is the [MASK] id {mask_id}, which would be read as "
            "context, not decoded: the slots to decode are max_new_tokens (between the prompt "
            "and suffix_ids when infilling)"
        )
    return out
