"""Files: atomic writes, model directories (safetensors + JSON config) and run ids.

A model directory holds ``model.safetensors``, ``config.json`` ({"model": ..., "paradigm": ...})
and, when known, ``tokenizer.json``. Everything is written to a temporary sibling first and moved
into place with `os.replace`, so a killed process never leaves a half-written file behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from setdiff.config import build, to_dict
from setdiff.files import (
    atomic_dir,
)
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, Paradigm, make_paradigm
from setdiff.tokenizer import (
    DEFAULT_SPECIAL,
    ROLES,
    SPECIAL_MAP_FILE,
    load_tokenizer,
    read_special_map,
)

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"


def run_id(*configs: Any) -> str:
    """Short stable hash of resolved configs (dataclasses or plain data)."""
    blob = json.dumps([to_dict(c) for c in configs], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def paradigm_record(paradigm: Paradigm) -> dict[str, Any]:
    return {"name": paradigm.config.name, **to_dict(paradigm.config)}


def file_weights(
    net: Transformer, state_dict: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """`state_dict` (or the net's own weights) as a weights file holds them: on the CPU,
    contiguous, without a tied output layer (`load_weights` restores it)."""
    weights = state_dict if state_dict is not None else net.state_dict()
    weights = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    if net.config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    return weights


def save_model_dir(
    directory: str | Path,
    net: Transformer,
    paradigm: Paradigm,
    *,
    tokenizer_file: str | Path | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    extra: dict[str, Any] | None = None,
    extra_files: dict[str, Path] | None = None,
) -> None:
    """Write a loadable model directory atomically (weights: `state_dict` or the net's own)."""
    weights = file_weights(net, state_dict)
    config = {
        "model": to_dict(net.config),
        "paradigm": paradigm_record(paradigm),
        "mask_id": paradigm.mask_id,
        **(extra or {}),
    }
    with atomic_dir(directory) as tmp:
        save_file(weights, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / TOKENIZER_FILE)
            # A pretrained tokenizer's roles travel with it (see setdiff.tokenizer).
            special_map = Path(tokenizer_file).with_name(SPECIAL_MAP_FILE)
            if special_map.exists():
                shutil.copyfile(special_map, tmp / SPECIAL_MAP_FILE)
        for name, source in (extra_files or {}).items():
            if Path(source).exists():
                shutil.copyfile(source, tmp / name)


def read_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{directory} is not a setdiff model directory (no {CONFIG_FILE})")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: corrupt JSON ({err})") from None
    if not isinstance(config, dict) or not isinstance(config.get("paradigm"), dict):
        raise ValueError(f"{path}: not a model config (no paradigm record)")
    required = {"model": dict, "mask_id": int}
    for key, kind in required.items():
        if not isinstance(config.get(key), kind):
            raise ValueError(f"{path}: not a model config (no {kind.__name__} {key!r})")
    if not isinstance(config["paradigm"].get("name"), str):
        raise ValueError(f"{path}: not a model config (no paradigm 'name')")
    return config


def is_model_dir(directory: str | Path) -> bool:
    """Whether `directory` holds a model of this project: a ``config.json`` with a ``model`` or
    ``paradigm`` record (a Hugging Face config has neither)."""
    try:
        config = json.loads((Path(directory) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool({"model", "paradigm"} & config.keys())


def load_net(directory: str | Path, device: str = "cpu") -> tuple[Transformer, Paradigm, dict]:
    """Rebuild the backbone and paradigm of a model directory, checking the weights fit."""
    directory = Path(directory)
    config = read_config(directory)
    model_config = build(ModelConfig, config["model"], f"{directory / CONFIG_FILE}: model")
    record = dict(config["paradigm"])
    name = record.pop("name")
    if name not in PARADIGMS:
        raise ValueError(f"{directory}: unknown paradigm {name!r}")
    paradigm_config = build(PARADIGMS[name][0], record, f"{directory / CONFIG_FILE}: paradigm")
    paradigm = make_paradigm(name, paradigm_config, mask_id=int(config["mask_id"]))
    net = Transformer(model_config)
    load_weights(net, directory / WEIGHTS_FILE)
    return net.to(device).eval(), paradigm, config


def load_weights(net: Transformer, path: str | Path) -> None:
    """Load safetensors weights into `net`, naming missing/unexpected/mis-shaped tensors."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing weights file {path}")
    try:
        weights = load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{path}: unreadable safetensors file ({err})") from None
    assign_weights(net, weights, path)


def assign_weights(net: Transformer, weights: dict[str, torch.Tensor], source: object) -> None:
    """Copy `weights` into `net`, naming missing, unexpected or mis-shaped tensors."""
    expected = net.state_dict()
    if net.config.tie_embeddings:
        expected.pop("lm_head.weight", None)
        weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    shapes = [
        f"{k}: {tuple(weights[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        raise ValueError(
            f"{source}: weights do not fit the model config "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {shapes[:5]})"
        )
    net.load_state_dict(weights, strict=not net.config.tie_embeddings)


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedModel:
    """A trained model ready to decode: backbone, paradigm and (when saved) tokenizer."""

    net: Transformer
    paradigm: Paradigm
    tokenizer: Any | None
    path: Path


def load_model(
    path: str | Path,
    device: str = "cpu",
    *,
    paradigm: str | None = None,
    task: str | None = None,
    tokenizer: str | Path | None = None,
) -> LoadedModel:
    """Load a model directory written by the train stage (or `save_model_dir`).

    The keyword arguments say what the caller expects (see `check_model_dir`); a directory that
    holds something else is refused before its weights are read.

    Raises:
        ValueError: naming the directory and both sides of a mismatch.
    """
    path = Path(path)
    check_model_dir(path, paradigm=paradigm, task=task, tokenizer=tokenizer)
    tokenizer_path = path / TOKENIZER_FILE
    own_tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path.exists() else None
    net, loaded_paradigm, _ = load_net(path, device)
    return LoadedModel(net=net, paradigm=loaded_paradigm, tokenizer=own_tokenizer, path=path)


def check_model_dir(
    path: str | Path,
    *,
    paradigm: str | None = None,
    task: str | None = None,
    tokenizer: str | Path | None = None,
) -> None:
    """Refuse a model directory that holds another paradigm, task or vocabulary than expected.

    Args:
        paradigm: the paradigm the caller will label the results with (a stage's
            ``--paradigm``, or the directory name ``models/<task>/<paradigm>``).
        task: the task; checked against the one the train stage records in ``config.json``.
        tokenizer: the task's ``tokenizer.json``: the model's own tokenizer must have the same
            vocabulary (a model saved without one needs an embedding row per token). Skipped
            when that file does not exist (stages that read raw data only).
    Raises:
        ValueError: naming the directory and both sides of the mismatch.
    """
    path = Path(path)
    config = read_config(path)
    found = config["paradigm"].get("name")
    if paradigm is not None and found != paradigm:
        raise ValueError(
            f"{path} holds a {found!r} model, not {paradigm!r}: a model of another paradigm was "
            "copied or saved there; retrain it (or load the right directory)"
        )
    if task is not None and config.get("task", task) != task:
        raise ValueError(
            f"{path} holds a model trained for task {config['task']!r}, not {task!r}; retrain it"
        )
    if tokenizer is not None and Path(tokenizer).exists():
        _check_vocabulary(path, config, Path(tokenizer))


def _check_vocabulary(path: Path, config: dict[str, Any], expected: Path) -> None:
    own = path / TOKENIZER_FILE
    if not own.exists():
        task_tokenizer = load_tokenizer(expected)
        rows = int(config["model"]["vocab_size"])
        if rows < task_tokenizer.vocab_size:
            raise ValueError(
                f"{path} has {rows} embedding rows but the task's {expected} has "
                f"{task_tokenizer.vocab_size} tokens; retrain the model"
            )
        return
    if own.read_bytes() != expected.read_bytes():
        model_tokenizer, task_tokenizer = load_tokenizer(own), load_tokenizer(expected)
        if model_tokenizer.backend.get_vocab(True) != task_tokenizer.backend.get_vocab(True):
            raise ValueError(
                f"{own} does not match the task's {expected} ({model_tokenizer.vocab_size} vs "
                f"{task_tokenizer.vocab_size} tokens): the model was trained on another "
                "tokenizer; retrain it"
            )
    _check_roles(own, expected)


def _check_roles(own: Path, expected: Path) -> None:
    """The special roles beside the model's tokenizer are the task tokenizer's (same vocabulary:
    a role pointing at another token, e.g. BOS and EOS swapped, would decode garbage)."""
    mine = read_special_map(own) or DEFAULT_SPECIAL
    task = read_special_map(expected) or DEFAULT_SPECIAL
    for role in ROLES:
        if mine[role] != task[role]:
            source = own.with_name(SPECIAL_MAP_FILE)
            raise ValueError(
                f"{source if source.exists() else own}: {role} is {mine[role]!r} but the "
                f"task's tokenizer ({expected}) has {task[role]!r}; the model's special tokens "
                f"were changed: restore its {SPECIAL_MAP_FILE} or retrain it"
            )
