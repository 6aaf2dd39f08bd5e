"""setdiff: set diffusion language models and their baselines (AR, MDLM, BD3LM, AO-GPT).

Public API:
- `load_model(path)` -> `LoadedModel` (backbone, paradigm, tokenizer)
- `generate(model, prompt_ids, *, max_new_tokens, **policy_options)` -> `GenerateResult`;
  `policy_options` are a `DecodeOptions` (e.g. ``window=4, threshold=0.9`` or ``"off"``)
- `generate_batch(model, prompts, *, max_new_tokens, **policy_options)` -> one `GenerateResult`
  per prompt, each equal to `generate` on that prompt alone
- `make_paradigm(name, config, mask_id=...)`, `Transformer`, `ModelConfig`
- `setdiff.masks.set_causal_mask`, `setdiff.masks.block_diffusion_mask`

Importing setdiff has no side effects (no torch settings are changed).
"""

from setdiff.artifacts import LoadedModel, load_model
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.sampling.batch import generate_batch
from setdiff.sampling.loop import GenerateResult, generate
from setdiff.sampling.policies import DecodeOptions

__all__ = [
    "PARADIGMS",
    "DecodeOptions",
    "GenerateResult",
    "LoadedModel",
    "ModelConfig",
    "Transformer",
    "generate",
    "generate_batch",
    "load_model",
    "make_paradigm",
]
