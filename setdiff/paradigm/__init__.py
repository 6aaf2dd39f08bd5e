"""Paradigms: the ONLY place AR, MDLM, BD3LM, AO-GPT and set diffusion differ.

Each paradigm is a config record plus a class with
- ``sample_noise(batch, generator) -> Noise``: its random draws (orders, noise levels, masks);
  ``training_noise`` the draws of a training step (the same, except where a recipe deviates
  from the estimator, as BD3LM's mask in every block);
- ``loss(model, batch, generator, noise=None) -> LossOutput``: its training mask and loss, all on
  the same `Transformer` backbone;
- ``decode_fixed() -> dict``: the decode options its trained model fixes, which its sampler
  (`setdiff.sampling.policies.decode_policy(paradigm, options)`) takes beside the user's; the
  paradigms sit below the sampler and never import it;
- capabilities that callers test instead of names: `needs_prompt`, `can_infill`,
  `exact_likelihood`, `set_size_field` (see `setdiff.paradigm.base._Paradigm`).

Modules: `base` (records, reductions, the base class), `ar`, `masked` (MDLM, BD3LM), `ordered`
(SetDLM, AO-GPT). Registry: ``PARADIGMS[name] = (ConfigClass, ParadigmClass)``;
`make_paradigm(name, config)`. Every public name is importable from `setdiff.paradigm`.

Losses are per-sequence means over target tokens, then a batch mean. `LossOutput` also carries
per-sequence NLL sums and token counts so evaluation can form corpus perplexities
``exp(sum nll / sum tokens)`` (exact for AR; an upper bound / NELBO for the others).
"""

from __future__ import annotations

from typing import Any, Literal

from setdiff.masks import AttentionKind
from setdiff.paradigm.ar import AR, ARConfig
from setdiff.paradigm.base import Batch, LossOutput, Noise
from setdiff.paradigm.masked import BD3LM, MDLM, BD3LMConfig, MDLMConfig
from setdiff.paradigm.ordered import AOGPT, AOGPTConfig, SetDLM, SetDLMConfig, SetLoss

__all__ = [
    "AOGPT",
    "AR",
    "BD3LM",
    "MDLM",
    "PARADIGMS",
    "AOGPTConfig",
    "ARConfig",
    "BD3LMConfig",
    "Batch",
    "LossOutput",
    "MDLMConfig",
    "Noise",
    "Paradigm",
    "ParadigmConfig",
    "ParadigmName",
    "SetDLM",
    "SetDLMConfig",
    "SetLoss",
    "make_paradigm",
]

ParadigmName = Literal["ar", "mdlm", "bd3lm", "aogpt", "setdlm"]
ParadigmConfig = ARConfig | MDLMConfig | BD3LMConfig | SetDLMConfig | AOGPTConfig
Paradigm = AR | MDLM | BD3LM | SetDLM | AOGPT

PARADIGMS: dict[str, tuple[type, type]] = {
    "ar": (ARConfig, AR),
    "mdlm": (MDLMConfig, MDLM),
    "bd3lm": (BD3LMConfig, BD3LM),
    "aogpt": (AOGPTConfig, AOGPT),
    "setdlm": (SetDLMConfig, SetDLM),
}


def make_paradigm(
    name: str, config: Any | None = None, *, mask_id: int, attention: AttentionKind = "sdpa"
) -> Paradigm:
    """Build a paradigm by name; `config` defaults to that paradigm's default config.

    `attention` picks how training masks reach the backbone ("sdpa": dense masks; "flex": a
    FlexAttention BlockMask, for block-sparse kernels on GPU)."""
    if name not in PARADIGMS:
        raise ValueError(f"paradigm: unknown paradigm {name!r}; choose one of {list(PARADIGMS)}")
    config_cls, cls = PARADIGMS[name]
    config = config_cls() if config is None else config
    if not isinstance(config, config_cls):
        raise ValueError(
            f"paradigm {name!r} needs a {config_cls.__name__}, got {type(config).__name__}"
        )
    if attention not in ("sdpa", "flex"):
        raise ValueError(f"attention must be 'sdpa' or 'flex', got {attention!r}")
    return cls(config, mask_id, attention)
