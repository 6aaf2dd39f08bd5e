"""AR baseline with ``transformers``: greedy ``generate`` with a KV cache, timed; batch 1
(`hf_generate`) or a left-padded batch (`hf_generate_batch`).

Works on any causal-LM directory, in particular one written by `setdiff.hf.export_hf`, whose
``generation_config.json`` suppresses [MASK] as our AR decoder does, so the two give the same
greedy tokens. Knows nothing of our model directories or paradigms.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

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
) -> dict[str, Any]:
    """Greedy decoding (``do_sample=False, use_cache=True``) of one prompt.

    Args:
        hf_dir: an HF model directory, or a model from `load_hf_model` (reuse it across calls:
            loading is not timed but is not free).
        prompt_ids: the prompt's token ids, BOS included if the model expects it.
        max_new_tokens: the most tokens to generate.
        eos_id: stop after this token (kept in the output); None = always `max_new_tokens`.
        device: where a model loaded from `hf_dir` runs.
    Returns:
        ``tokens`` (new ids, up to and including EOS), ``seconds`` (generate time; CUDA events
        on a GPU), ``wall_seconds``, ``n_new_tokens``, ``tokens_per_second``, ``stopped``
        (EOS reached) and ``device``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token (e.g. BOS)")
    model = load_hf_model(hf_dir, device=device) if isinstance(hf_dir, str | Path) else hf_dir
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
    with torch.inference_mode():
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
    }


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
