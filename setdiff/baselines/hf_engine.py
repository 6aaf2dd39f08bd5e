"""AR baseline with ``transformers``: greedy ``generate`` with a KV cache, timed; batch 1
(`hf_generate`, also speculative: assisted generation with a draft model, or prompt lookup
decoding) or a left-padded batch (`hf_generate_batch`).

Works on any causal-LM directory, in particular one written by `setdiff.hf.export_hf`, whose
``generation_config.json`` suppresses [MASK] as our AR decoder does, so the two give the same
greedy tokens. Knows nothing of our model directories or paradigms.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from setdiff.arguments import is_int

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


def load_hf_model(
    hf_dir: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """A local HF causal LM in eval mode on `device` (no network: ``local_files_only``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype, local_files_only=True)
    logger.info("loaded %s (%s) on %s", hf_dir, type(model).__name__, device)
    return model.to(device).eval()


def hf_generate(
    hf_dir: str | Path | PreTrainedModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_id: int | None,
    *,
    device: str = "cpu",
    assistant_model: PreTrainedModel | None = None,
    assistant_tokens: int | None = None,
    prompt_lookup_num_tokens: int | None = None,
) -> dict[str, Any]:
    """Greedy decoding (``do_sample=False, use_cache=True``) of one prompt; speculative with
    `assistant_model` or `prompt_lookup_num_tokens` (the same greedy tokens, up to float
    rounding, in fewer forwards of the model when drafts agree).

    Args:
        hf_dir: an HF model directory, or a model from `load_hf_model` (reuse it across calls:
            loading is not timed but is not free).
        prompt_ids: the prompt's token ids, BOS included if the model expects it.
        max_new_tokens: the most tokens to generate.
        eos_id: stop after this token (kept in the output); None = always `max_new_tokens`.
        device: where a model loaded from `hf_dir` runs.
        assistant_model: assisted generation: this small causal LM of the same vocabulary (on
            the model's device) drafts tokens greedily, the model checks them in one forward.
        assistant_tokens: the tokens it drafts per forward (a constant k, no confidence
            cut-off, as our ``draft_tokens``); None = its generation config's (transformers:
            20, cut off below confidence 0.4).
        prompt_lookup_num_tokens: prompt lookup decoding: drafts of this many tokens copied
            from the prompt (and output) after the latest matching n-gram.
    Returns:
        ``tokens`` (new ids, up to and including EOS), ``seconds`` (generate time; CUDA events
        on a GPU), ``wall_seconds``, ``n_new_tokens``, ``tokens_per_second``, ``stopped``
        (EOS reached), ``device``, ``forwards`` (forward calls of the model, the prefill's
        included), ``tokens_per_forward`` and ``assistant_forwards`` (of `assistant_model`).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token (e.g. BOS)")
    if assistant_model is not None and prompt_lookup_num_tokens is not None:
        raise ValueError("assistant_model and prompt_lookup_num_tokens: choose one draft source")
    if assistant_tokens is not None and assistant_model is None:
        raise ValueError("assistant_tokens needs assistant_model")
    for name, k in (
        ("assistant_tokens", assistant_tokens),
        ("prompt_lookup_num_tokens", prompt_lookup_num_tokens),
    ):
        if k is not None and not (is_int(k) and k >= 1):
            raise ValueError(f"{name} must be an int >= 1, got {k!r}")
    model = load_hf_model(hf_dir, device=device) if isinstance(hf_dir, str | Path) else hf_dir
    if assistant_model is not None and (
        assistant_model.config.vocab_size != model.config.vocab_size
    ):
        raise ValueError(
            f"assistant_model has vocab_size {assistant_model.config.vocab_size}, the model "
            f"{model.config.vocab_size}: a draft model must share the model's vocabulary"
        )
    run_device = next(model.parameters()).device
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=run_device)  # (1, T)
    kwargs: dict[str, Any] = dict(
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        use_cache=True,
        max_new_tokens=max_new_tokens,
        # Passed even when None: a keyword None overrides the model's generation config.
        eos_token_id=eos_id,
        pad_token_id=_pad_id(model, eos_id),
    )
    if assistant_model is not None:
        kwargs["assistant_model"] = assistant_model
    if prompt_lookup_num_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    with (
        torch.inference_mode(),
        _assistant_tokens(assistant_model, assistant_tokens),
        _count_forwards(model) as forwards,
        _count_forwards(assistant_model) as assistant_forwards,
    ):
        output, seconds, wall = _timed(lambda: model.generate(input_ids, **kwargs), run_device)
    tokens = output[0, input_ids.shape[1] :].tolist()
    return {
        "tokens": tokens,
        "seconds": seconds,
        "wall_seconds": wall,
        "n_new_tokens": len(tokens),
        "tokens_per_second": len(tokens) / seconds if seconds > 0 else float("inf"),
        "stopped": eos_id is not None and bool(tokens) and tokens[-1] == eos_id,
        "device": str(run_device),
        "forwards": forwards[0],
        "tokens_per_forward": len(tokens) / max(forwards[0], 1),
        "assistant_forwards": assistant_forwards[0],
    }


@contextlib.contextmanager
def _count_forwards(model: torch.nn.Module | None) -> Iterator[list[int]]:
    """``[n]``: the forward calls of `model` inside the block (a forward hook; none for None)."""
    count = [0]
    if model is None:
        yield count
        return

    def hook(*_: Any) -> None:
        count[0] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


@contextlib.contextmanager
def _assistant_tokens(assistant: PreTrainedModel | None, k: int | None) -> Iterator[None]:
    """Inside the block `assistant` drafts exactly `k` tokens per forward (a constant schedule,
    no confidence cut-off; transformers reads these from the assistant's generation config);
    its own config is restored after."""
    if assistant is None or k is None:
        yield
        return
    original = assistant.generation_config
    config = copy.deepcopy(original)
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    assistant.generation_config = config
    try:
        yield
    finally:
        assistant.generation_config = original


def hf_generate_batch(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    eos_id: int | None,
) -> dict[str, Any]:
    """Greedy batched decoding: the prompts left-padded into one ``generate`` call.

    Each row stops at EOS (kept) or at its own `max_new_tokens`; rows that end early are padded
    by ``generate`` until the longest is done, and those pads are not returned. Returns
    ``tokens`` (one list of new ids per row), ``seconds`` (the one generate call) and
    ``forwards`` (its batched forwards: one per generated column, the prefill's included).
    """
    if not prompts or any(not p for p in prompts):
        raise ValueError("prompts must be non-empty lists of token ids (e.g. BOS first)")
    device, pad = next(model.parameters()).device, _pad_id(model, eos_id)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(list(prompt))
        attention[i, width - len(prompt) :] = 1
    kwargs: dict[str, Any] = dict(
        attention_mask=attention.to(device),
        do_sample=False,
        use_cache=True,
        max_new_tokens=max(max_new_tokens),
        eos_token_id=eos_id,
        pad_token_id=pad,
    )
    with torch.inference_mode():
        output, seconds, _ = _timed(lambda: model.generate(input_ids.to(device), **kwargs), device)
    tokens = []
    for row, limit in zip(output[:, width:].tolist(), max_new_tokens, strict=True):
        row = row[:limit]
        if eos_id is not None and eos_id in row:
            row = row[: row.index(eos_id) + 1]
        tokens.append(row)
    return {"tokens": tokens, "seconds": seconds, "forwards": output.shape[1] - width}


def _pad_id(model: PreTrainedModel, eos_id: int | None) -> int:
    """The model's pad token, else EOS, else 0 (padding is masked out either way)."""
    pad = model.generation_config.pad_token_id
    return pad if pad is not None else (eos_id if eos_id is not None else 0)


def _timed(
    fn: Callable[[], torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, float, float]:
    """Run `fn`; return its result, device time (CUDA events on a GPU) and wall time."""
    if device.type != "cuda":
        tic = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - tic
        return result, wall, wall
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    tic = time.perf_counter()
    start.record()
    result = fn()
    end.record()
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - tic
    return result, start.elapsed_time(end) / 1000.0, wall
