"""Initial weights of a backbone before training: the one rule the train stage and trials share.

A model starts from one of three sources (`initial_source` picks it): this task's trained AR model
directory (a diffusion paradigm with ``train.<task>.init_from_ar``, the paper's recipe), a
pretrained Hugging Face checkpoint (``model.<task>.pretrained``: a path or hub id, a `str`), or
random weights drawn after ``torch.manual_seed(seed)`` (None). `initial_weights` builds the
backbone from it; `inputs_fingerprint` hashes what a training's weights depend on besides its
configs (data, tokenizer, starting weights), so that no checkpoint, cache or stored result made
from other inputs is taken for this one. Nothing here reads params or writes files.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from setdiff.artifacts import WEIGHTS_FILE, load_model
from setdiff.batching import ArraySplit
from setdiff.config import ConfigError
from setdiff.files import sha256_file
from setdiff.model import ModelConfig, Transformer

log = logging.getLogger(__name__)


def initial_source(
    paradigm: str, *, init_from_ar: bool, ar_model: Path, pretrained: str | None
) -> Path | str | None:
    """Where `paradigm`'s training starts: the AR model directory, a pretrained id, or None.

    Args:
        init_from_ar: ``train.<task>.init_from_ar`` (diffusion paradigms only; AR never starts
            from itself).
        ar_model: the task's AR model directory (``models/<task>/ar``).
        pretrained: ``model.<task>.pretrained`` (a checkpoint directory or hub id), or None.
    """
    if paradigm != "ar" and init_from_ar:
        return ar_model
    return pretrained


def initial_weights(
    net_config: ModelConfig,
    seed: int,
    init: Path | str | None,
    task: str,
    tokenizer: Path | None = None,
    *,
    paradigm: str = "ar",
) -> Transformer:
    """A fresh backbone; this task's trained AR weights when `init` is that model directory; or
    a pretrained Hugging Face checkpoint when `init` names one (``model.<task>.pretrained``).
    `paradigm` is what a model directory must hold: AR for the paper's recipe; another paradigm
    when a fine-tune continues from that paradigm's model (`setdiff.stages.setsize`).

    The global torch RNG is seeded with `seed` first in every case, so training that follows
    draws the same random numbers whichever source the weights came from.

    Raises:
        ConfigError: a missing AR model, or a checkpoint whose shape differs from `net_config`.
    """
    torch.manual_seed(seed)
    if isinstance(init, str):
        from setdiff.hf import load_hf_backbone

        net, _ = load_hf_backbone(init, max_seq_len=net_config.max_seq_len)
        if net.config != net_config:
            raise ConfigError(f"{init}: checkpoint config {net.config} != {net_config}")
        log.info("initialised from pretrained %s", init)
        return net
    if init is not None and not (init / "model.safetensors").exists():
        if paradigm == "ar":
            raise ConfigError(
                f"train.{task}.init_from_ar is true but {init} has no trained AR model"
            )
        raise ConfigError(f"{init} has no trained {paradigm} model to start from")
    net = Transformer(net_config)
    if init is not None:
        trained = load_model(init, paradigm=paradigm, task=task, tokenizer=tokenizer).net
        if trained.config != net_config:
            raise ConfigError(
                f"{init}: {paradigm} model {trained.config} differs from model.{task}"
            )
        net.load_state_dict(trained.state_dict())
        log.info("initialised from %s", init)
    return net


INPUT_NAMES = {
    "train": "encoded train split",
    "valid": "encoded valid split",
    "tokenizer": "tokenizer",
    "init": "start weights",
}
"""The keys of `inputs_fingerprint`, in words (for the line that says which of them changed)."""


def inputs_fingerprint(
    train: ArraySplit, valid: ArraySplit, tokenizer: Path, source: Path | str | None
) -> dict[str, str | None]:
    """sha256 of every input of a training besides its configs: the encoded splits (as read,
    checked against their manifest), the tokenizer file, and the starting weights
    (`source_sha256`). Keyed by `INPUT_NAMES`."""
    return {
        "train": train.sha256,
        "valid": valid.sha256,
        "tokenizer": sha256_file(tokenizer),
        "init": source_sha256(source),
    }


def source_sha256(source: Path | str | None) -> str | None:
    """sha256 of the starting weights `initial_source` names: a model directory's weights file,
    a pretrained checkpoint's files; None for random weights (drawn from the config's seed)."""
    if source is None:
        return None
    if isinstance(source, str):
        from setdiff.hf import checkpoint_sha256

        return checkpoint_sha256(source)
    return weights_sha256(source, f"{source} has no trained model to start from")


def weights_sha256(model_dir: Path, missing: str) -> str:
    """sha256 of a model directory's weights file; `missing` is the error when it has none."""
    weights = model_dir / WEIGHTS_FILE
    if not weights.exists():
        raise ConfigError(missing)
    return sha256_file(weights)
