"""Conversion between our backbone and Hugging Face Llama / Qwen3 checkpoints.

- `export_hf`: an ``ar`` model directory -> a ``LlamaForCausalLM`` directory (``Qwen3ForCausalLM``
  when the backbone has q/k norms) that ``transformers`` and vLLM load as is. Only ``ar`` models
  are exported: the other paradigms' heads predict their own (masked) position, not the next
  token, so no causal-LM runtime would decode them correctly.
- `load_hf_backbone`: a local (or hub, when online) Llama- or Qwen3-style checkpoint -> our
  `Transformer`, e.g. to initialise training from a pretrained model. Features the backbone
  does not implement (RoPE scaling, biases, sliding windows, ...) are refused by field name.
- `pretrained_config` / `load_pretrained_tokenizer`: a pretrained checkpoint's backbone config
  and tokenizer (with its [MASK] chosen by `choose_mask_id`) for the ``pretrained`` params keys.
- `choose_mask_id`: reuse an existing special token as [MASK] when no vocabulary row is free.

Parameter names are the same in both formats (see `setdiff.model`), so no tensor is renamed.
Nothing here trains, decodes or reads params.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors.torch import load_file, save_file

from setdiff import hub
from setdiff.artifacts import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    assign_weights,
    is_model_dir,
    load_net,
)
from setdiff.cli import debug_flag, user_errors
from setdiff.files import atomic_path, naming_full_disk, sha256_file, write_bytes, write_json
from setdiff.model import ModelConfig, Transformer, rope_inv_freq
from setdiff.tokenizer import (
    ROLES,
    SPECIAL_MAP_FILE,
    Tokenizer,
    TokenizerConfig,
    declared_roles,
    load_hf_tokenizer,
    load_tokenizer,
)

logger = logging.getLogger(__name__)

PREFERRED_MASK_TOKENS: tuple[str, ...] = ("<|fim_middle|>", "<mask>", "[MASK]")
"""Existing tokens reused as [MASK], in order of preference (Qwen's FIM token first)."""

SUPPORTED_MODEL_TYPES: dict[str, bool] = {"llama": False, "mistral": False, "qwen3": True}
"""HF ``model_type`` -> whether its attention has per-head q/k RMSNorm."""

DEFAULT_HEAD_DIM: dict[str, int] = {"qwen3": 128}
"""HF's class default for ``head_dim`` when a config omits it (others: hidden / heads)."""

INDEX_FILE = "model.safetensors.index.json"
MODEL_FILES: tuple[str, ...] = ("*.json", "*.safetensors")
"""What a backbone needs from a hub repository (configs, tokenizer, weights)."""
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json", SPECIAL_MAP_FILE)
GENERATION_FILE = "generation_config.json"
"""Written first by `export_hf`: it marks a folder as an export (a tokenizer folder has none)."""
EXPORT_FILES: tuple[str, ...] = (CONFIG_FILE, GENERATION_FILE, WEIGHTS_FILE, *TOKENIZER_FILES)
"""What `export_hf` writes: a folder holding these only, `GENERATION_FILE` among them, is an
earlier export, written over."""


# ---------------------------------------------------------------------------------------------
# export


def export_hf(model_dir: Path, out_dir: Path) -> Path:
    """Write an ``ar`` model directory into `out_dir` as a Hugging Face causal-LM directory.

    As ``save_pretrained`` does, `out_dir` is created when missing and its files are written
    there, each atomically: ``generation_config.json`` (greedy; the [MASK] id in
    ``suppress_tokens``, as our decoder never emits it), ``model.safetensors`` (same tensor
    names, float32), the tokenizer (``tokenizer.json``, ``tokenizer_config.json``,
    ``special_tokens_map.json``) and ``config.json`` last, so a folder left by a failed export
    does not load as a model (and an export over it works). A folder the export created is
    removed when it fails; nothing else is.

    Returns:
        `out_dir`.
    Raises:
        ValueError: if `out_dir` is no place for an export (`check_export_target`), the model
            is not ``ar`` or the directory has no tokenizer; nothing is written then.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_export_target(model_dir, out_dir)
    net, paradigm, _ = load_net(model_dir)
    name = paradigm.config.name
    if name != "ar":
        raise ValueError(
            f"{model_dir}: only 'ar' models export to a causal LM; paradigm {name!r} predicts "
            "each (masked) position's own token, not the next one"
        )
    tokenizer_path = model_dir / TOKENIZER_FILE
    if not tokenizer_path.exists():
        raise ValueError(f"{model_dir}: no {TOKENIZER_FILE}; export needs the tokenizer")
    tokenizer = load_tokenizer(tokenizer_path)
    config = hf_config(net.config, tokenizer)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with naming_full_disk(out_dir):
            (out_dir / CONFIG_FILE).unlink(missing_ok=True)  # an earlier export's, replaced last
            write_json(out_dir / GENERATION_FILE, _generation_config(tokenizer, paradigm.mask_id))
            with atomic_path(out_dir / WEIGHTS_FILE) as tmp:
                save_file(_export_weights(net), str(tmp), metadata={"format": "pt"})
            _save_hf_tokenizer(tokenizer_path, out_dir, net.config.max_seq_len)
            write_json(out_dir / CONFIG_FILE, config)
    except BaseException:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    logger.info("exported %s -> %s", model_dir, out_dir)
    return out_dir


def check_export_target(model_dir: Path, out_dir: Path) -> None:
    """Refuse an output folder an export would damage: the model directory or one inside it,
    or a folder holding anything but an earlier export (`EXPORT_FILES`): a model directory of
    the pipeline or a folder of them, a task's tokenizer folder, ...

    Raises:
        ValueError: naming `out_dir` and why.
    """
    refused = f"{out_dir}: refused as the export folder"
    model, out = Path(model_dir).resolve(), Path(out_dir).resolve()
    if out == model or model in out.parents:
        where = "is" if out == model else "is inside"
        raise ValueError(f"{refused}: it {where} the model directory {model_dir}")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ValueError(f"{refused}: it is a file")
    if is_model_dir(out_dir):
        raise ValueError(f"{refused}: it is a model directory of the pipeline")
    entries = sorted(out_dir.iterdir())
    held = [p for p in entries if p.is_dir() and is_model_dir(p)]
    if held:
        raise ValueError(f"{refused}: it holds the model directory {held[0]}")
    others = [p.name for p in entries if p.name not in EXPORT_FILES or not p.is_file()]
    if others:
        raise ValueError(
            f"{refused}: it holds {others[:3]}, not only an earlier export's files; "
            "export to a new or empty folder"
        )
    if entries and not (out_dir / GENERATION_FILE).is_file():
        raise ValueError(
            f"{refused}: it holds {[p.name for p in entries][:3]} but no {GENERATION_FILE}, "
            "so it is not an earlier export; export to a new or empty folder"
        )


def hf_config(config: ModelConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """The HF ``config.json`` of a backbone: Llama, or Qwen3 when it has q/k norms.

    Raises:
        ValueError: naming the backbone option no served HF architecture here reproduces.
    """
    _check_exportable(config)
    model_type = "qwen3" if config.qk_norm else "llama"
    architecture = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]
    record: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        # Both spellings: transformers < 5 reads rope_theta, >= 5 reads rope_parameters.
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
        "torch_dtype": "float32",
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if model_type == "llama":
        record["mlp_bias"] = config.mlp_bias
    else:
        record.update(use_sliding_window=False, sliding_window=None)
    return record


def _check_exportable(config: ModelConfig) -> None:
    blocked = {
        "norm": config.norm != "rms",
        "mlp": config.mlp != "swiglu",
        "learned_positions": config.learned_positions,
        "mlp_bias": config.mlp_bias and config.qk_norm,  # Qwen3 has no MLP biases
    }
    for field, is_set in blocked.items():
        if is_set:
            raise ValueError(
                f"model.{field} = {getattr(config, field)!r} has no Llama/Qwen3 counterpart; "
                "this backbone cannot be exported to Hugging Face"
            )


def _generation_config(tokenizer: Tokenizer, mask_id: int) -> dict[str, Any]:
    return {
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
        "do_sample": False,
        # Our AR decoder sets the [MASK] logit to -inf; HF generate does the same with this.
        "suppress_tokens": [mask_id],
    }


def _export_weights(net: Transformer) -> dict[str, torch.Tensor]:
    weights = {
        k: v.detach().to("cpu", torch.float32).contiguous() for k, v in net.state_dict().items()
    }
    if net.config.tie_embeddings:
        weights.pop("lm_head.weight")  # HF re-ties it to the embedding on load
    return weights


def _save_hf_tokenizer(tokenizer_path: Path, out_dir: Path, max_len: int) -> None:
    hf_tokenizer = load_hf_tokenizer(tokenizer_path)
    hf_tokenizer.model_max_length = max_len
    with tempfile.TemporaryDirectory() as saved:
        hf_tokenizer.save_pretrained(saved)
        write_bytes(out_dir / TOKENIZER_FILE, (Path(saved) / TOKENIZER_FILE).read_bytes())
        config = json.loads((Path(saved) / "tokenizer_config.json").read_text())
    # transformers >= 5 writes its own backend class name; this one loads in 4.x and 5.x alike.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_json(out_dir / "tokenizer_config.json", config)
    special = {
        role: config[role]
        for role in ("bos_token", "eos_token", "pad_token", "mask_token", "unk_token")
        if role in config
    }
    write_json(out_dir / SPECIAL_MAP_FILE, special)


# ---------------------------------------------------------------------------------------------
# import


def load_hf_backbone(
    path: str | Path, *, dtype: torch.dtype = torch.float32, max_seq_len: int | None = None
) -> tuple[Transformer, dict[str, Any]]:
    """Our backbone initialised from a Llama- or Qwen3-style HF checkpoint directory.

    Args:
        path: a local directory with ``config.json`` and ``model.safetensors`` (or shards listed
            in ``model.safetensors.index.json``); a string that is not a local path but looks
            like a hub id (``owner/name``) is fetched with `huggingface_hub.snapshot_download`.
        dtype: parameter dtype of the returned backbone.
        max_seq_len: our row length L to record in the config (default: the checkpoint's
            ``max_position_embeddings``); RoPE is computed, so no weight depends on it.
    Returns:
        The backbone in eval mode on the CPU, and the checkpoint's ``config.json`` as read.
    Raises:
        ValueError: on an unsupported architecture or feature (the message names the field),
            missing or unexpected tensors, or a missing weights file.
    """
    directory = hub.resolve(path, patterns=MODEL_FILES, needs="config.json")
    raw = json.loads((directory / "config.json").read_text())
    config = model_config_from_hf(raw)
    if max_seq_len is not None:
        config = dataclasses.replace(config, max_seq_len=max_seq_len)
    net = Transformer(config)
    weights = _read_weights(directory)
    _load_state(net, weights, directory)
    net.to(dtype)
    # RoPE frequencies stay float32 whatever the parameter dtype, as in HF.
    net.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta)
    logger.info("loaded %s backbone from %s", raw["model_type"], directory)
    return net.eval(), raw


def model_config_from_hf(raw: Mapping[str, Any]) -> ModelConfig:
    """Map an HF ``config.json`` onto `ModelConfig`, refusing what the backbone lacks.

    Raises:
        ValueError: naming the unsupported or missing field.
    """
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; use one of {list(SUPPORTED_MODEL_TYPES)}"
        )
    _check_features(raw)
    missing = [
        key
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
        + ("num_attention_heads", "max_position_embeddings")
        if raw.get(key) is None
    ]
    if missing:
        raise ValueError(f"config.json lacks required field(s) {missing}")
    n_head, d_model = int(raw["num_attention_heads"]), int(raw["hidden_size"])
    head_dim = raw.get("head_dim") or DEFAULT_HEAD_DIM.get(model_type) or d_model // n_head
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]),
        n_layer=int(raw["num_hidden_layers"]),
        n_head=n_head,
        n_kv_head=int(raw.get("num_key_value_heads") or n_head),
        d_model=d_model,
        d_ff=int(raw["intermediate_size"]),
        max_seq_len=int(raw["max_position_embeddings"]),
        rope_theta=_rope_theta(raw),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        head_dim_override=None if head_dim * n_head == d_model else int(head_dim),
        qk_norm=SUPPORTED_MODEL_TYPES[model_type],
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
    )


def _check_features(raw: Mapping[str, Any]) -> None:
    """Raise a ValueError naming the first field that asks for something we do not implement."""
    unsupported = {
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
        "mlp_bias": bool(raw.get("mlp_bias")) and raw.get("model_type") != "llama",
        "rope_scaling": raw.get("rope_scaling") not in (None, {"rope_type": "default"}),
        "rope_parameters.rope_type": (raw.get("rope_parameters") or {}).get("rope_type", "default")
        != "default",
        "partial_rotary_factor": float(
            (raw.get("rope_parameters") or {}).get(
                "partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)
            )
        )
        != 1.0,
        "use_sliding_window": bool(raw.get("use_sliding_window")),
        "sliding_window": raw.get("sliding_window") is not None
        and raw.get("model_type") != "qwen3",  # Qwen3 ignores it unless use_sliding_window
        "layer_types": any(t != "full_attention" for t in raw.get("layer_types") or ()),
        "quantization_config": raw.get("quantization_config") is not None,
    }
    for field, is_set in unsupported.items():
        if is_set:
            value = raw.get(field.split(".")[0])
            raise ValueError(f"unsupported config field {field!r} = {value!r}")


def _rope_theta(raw: Mapping[str, Any]) -> float:
    rope_parameters = raw.get("rope_parameters") or {}
    theta = rope_parameters.get("rope_theta", raw.get("rope_theta", 10000.0))
    return float(theta)


def checkpoint_sha256(path: str | Path) -> str:
    """One sha256 over a Llama/Qwen3 checkpoint's ``config.json`` and weight files (what
    `load_hf_backbone` reads): a checkpoint whose bytes change gets another hash."""
    directory = hub.resolve(path, patterns=MODEL_FILES, needs="config.json")
    digest = hashlib.sha256()
    for name in ["config.json", *_weight_files(directory)]:
        digest.update(f"{name}:{sha256_file(directory / name)}\n".encode())
    return digest.hexdigest()


def _weight_files(directory: Path) -> list[str]:
    index = directory / INDEX_FILE
    if index.exists():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    if (directory / WEIGHTS_FILE).exists():
        return [WEIGHTS_FILE]
    raise ValueError(
        f"{directory}: no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors are supported)"
    )


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for name in _weight_files(directory):
        weights.update(load_file(str(directory / name)))
    return weights


def _load_state(net: Transformer, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Copy `weights` into `net`, naming missing, unexpected or mis-shaped tensors."""
    # Old Llama checkpoints store RoPE tables; we derive them from the config.
    weights = {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}
    assign_weights(net, weights, source)


def pretrained_config(source: str | Path, seq_len: int) -> ModelConfig:
    """The backbone config of a pretrained checkpoint, for rows of `seq_len` tokens.

    Only ``config.json`` is read. ``max_seq_len`` becomes `seq_len` (our row length; RoPE
    positions are computed, so nothing is sized by the checkpoint's context length).
    """
    directory = hub.resolve(source, patterns=MODEL_FILES, needs="config.json")
    raw = json.loads((directory / "config.json").read_text())
    return dataclasses.replace(model_config_from_hf(raw), max_seq_len=seq_len)


def load_pretrained_tokenizer(config: TokenizerConfig) -> Tokenizer:
    """A pretrained tokenizer (``kind: pretrained``) with its four roles resolved.

    Roles come from `config` where set, else from the directory's ``tokenizer_config.json`` /
    ``special_tokens_map.json``; BOS and PAD fall back to EOS (Qwen3 has neither), and [MASK]
    to the first of `PREFERRED_MASK_TOKENS` in the vocabulary (Qwen3: ``<|fim_middle|>``).

    Raises:
        ValueError: naming a role left without a token (no EOS anywhere, no mask candidate).
    """
    directory = hub.resolve(config.source, patterns=TOKENIZER_FILES, needs="tokenizer.json")
    backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    special = {
        **_declared_special(directory, SPECIAL_MAP_FILE),
        **_declared_special(directory, "tokenizer_config.json"),
        **config.special_overrides(),
    }
    if not special.get("eos_token"):
        raise ValueError(f"{directory}: the tokenizer declares no eos_token; set eos_token")
    special.setdefault("bos_token", special["eos_token"])
    special.setdefault("pad_token", special["eos_token"])
    if not special.get("mask_token"):
        vocab = backend.get_vocab(with_added_tokens=True)
        special["mask_token"] = backend.id_to_token(choose_mask_id(vocab))
    return Tokenizer(backend, directory / "tokenizer.json", {r: special[r] for r in ROLES})


def _declared_special(directory: Path, name: str) -> dict[str, str]:
    """The roles the tokenizer file `name` in `directory` declares ({} when it is absent)."""
    path = directory / name
    return declared_roles(json.loads(path.read_text())) if path.exists() else {}


# ---------------------------------------------------------------------------------------------
# mask token


def choose_mask_id(
    tokenizer_or_vocab: Any, preferred: Sequence[str] = PREFERRED_MASK_TOKENS
) -> int:
    """The id of the first token of `preferred` in the vocabulary, to be reused as [MASK].

    Args:
        tokenizer_or_vocab: a token -> id mapping, a `setdiff.tokenizer.Tokenizer`, a
            ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer.
        preferred: candidate tokens, best first.
    Raises:
        ValueError: if none of them is in the vocabulary.
    """
    vocab = _vocab_of(tokenizer_or_vocab)
    for token in preferred:
        if token in vocab:
            return int(vocab[token])
    raise ValueError(
        f"none of {list(preferred)} is in the vocabulary; pass preferred=(<an unused token>,)"
    )


def _vocab_of(tokenizer_or_vocab: Any) -> Mapping[str, int]:
    if isinstance(tokenizer_or_vocab, Mapping):
        return tokenizer_or_vocab
    if isinstance(tokenizer_or_vocab, Tokenizer):
        return tokenizer_or_vocab.backend.get_vocab(with_added_tokens=True)
    # tokenizers.Tokenizer and transformers tokenizers both include added tokens by default.
    return tokenizer_or_vocab.get_vocab()


# ---------------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m setdiff.hf [--debug] export <model_dir> <out_dir>``; bad input (a wrong model
    or output folder, a full disk) is one line, ``error: <message>``, exit status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m setdiff.hf", description="Hugging Face format conversion."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write an ar model directory in HF Llama format")
    export.add_argument("model_dir", type=Path)
    export.add_argument("out_dir", type=Path)
    argv, debug = debug_flag(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with user_errors(debug):
        export_hf(args.model_dir, args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
