"""setdiff: set diffusion language models and their baselines (AR, MDLM, BD3LM, AO-GPT).

Public API:
- `load_model(path)` -> `LoadedModel` (backbone, paradigm, tokenizer)
- `generate(model, prompt_ids, *, max_new_tokens, **policy_options)` -> `GenerateResult`;
  `policy_options` are a `DecodeOptions` (e.g. ``window=4, threshold=0.9`` or ``"off"``)
- `generate_batch(model, prompts, *, max_new_tokens, **policy_options)` -> one `GenerateResult`
  per prompt, each equal to `generate` on that prompt alone
- `make_paradigm(name, config, mask_id=...)`, `Transformer`, `ModelConfig`
- `setdiff.masks.set_causal_mask`, `setdiff.masks.block_diffusion_mask`

Importing setdiff has no side effects (no torch settings are changed) and imports nothing: each
name loads its module on first use (PEP 562), so a stage's import closure, and with it the code
its DVC stage depends on (`setdiff dvc-deps`), is what the stage runs, not the whole package.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_EXPORTS = {
    "PARADIGMS": "setdiff.paradigm",
    "DecodeOptions": "setdiff.sampling.policies",
    "GenerateResult": "setdiff.sampling.loop",
    "LoadedModel": "setdiff.artifacts",
    "ModelConfig": "setdiff.model",
    "Transformer": "setdiff.model",
    "generate": "setdiff.sampling.loop",
    "generate_batch": "setdiff.sampling.loop",
    "load_model": "setdiff.artifacts",
    "make_paradigm": "setdiff.paradigm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The public names, and submodules (``setdiff.masks``), loaded on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
