"""DVC stage ``tokenize``: train one task's tokenizer and encode its splits to fixed length.

``setdiff tokenize --task arith [--params params.yaml] [--root .]`` reads ``tokenizer.<task>``
and ``data/<task>/raw/*.jsonl`` (from ``prepare``), trains the tokenizer on the train split (or
loads a pretrained one, ``kind: pretrained``), and writes ``data/<task>/tokenizer/tokenizer.json``
with its roles in ``special_tokens_map.json``, ``data/<task>/encoded/{split}.npz`` (keys
``tokens``, ``context_len``, ``length``; the ``np.savez`` format, written with fixed zip
timestamps so equal arrays give equal bytes) and ``data/<task>/encoded/manifest.json``.
Every file is written atomically.
"""

from __future__ import annotations

import io
import logging
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from setdiff import data
from setdiff.artifacts import sha256_bytes, write_bytes, write_json, write_text
from setdiff.config import to_dict
from setdiff.params import load_params
from setdiff.stages.common import Layout, parse_args, setup_logging
from setdiff.tokenizer import (
    ROLES,
    SPECIAL_MAP_FILE,
    EncodedSplit,
    Tokenizer,
    TokenizerConfig,
    encode_examples,
    train_tokenizer,
    training_texts,
)

logger = logging.getLogger(__name__)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes `np.savez` would write for `arrays`, but with a fixed zip timestamp."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def read_raw_splits(raw_dir: Path) -> data.Splits:
    """The jsonl splits written by ``prepare``; a clear error if any is missing."""
    paths = {name: raw_dir / f"{name}.jsonl" for name in data.SPLIT_NAMES}
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"missing raw split(s) {missing}: run `setdiff prepare` first")
    return {name: data.from_jsonl(path.read_bytes()) for name, path in paths.items()}


def write_split(path: Path, split: EncodedSplit) -> str:
    """Write one encoded split atomically; returns its sha256.

    Raises:
        ValueError: if the split has no rows (every example was longer than seq_len).
    """
    if split.tokens.shape[0] == 0:
        raise ValueError(
            f"{path}: no example fits seq_len={split.tokens.shape[1]} "
            f"({split.n_dropped} dropped); raise tokenizer.<task>.seq_len"
        )
    payload = npz_bytes(
        {"tokens": split.tokens, "context_len": split.context_len, "length": split.length}
    )
    write_bytes(path, payload)
    return sha256_bytes(payload)


def make_tokenizer(config: TokenizerConfig, train: list[data.Record], task: str) -> Tokenizer:
    """Train the task's tokenizer on its train records, or load the pretrained one."""
    if config.kind == "pretrained":
        from setdiff.hf import load_pretrained_tokenizer

        return load_pretrained_tokenizer(config)
    return Tokenizer(train_tokenizer(training_texts(train, task), config))


def main(argv: list[str]) -> None:
    """Train ``--task``'s tokenizer on its train split and encode all three splits."""
    args = parse_args(
        argv, "Train a task's tokenizer and encode its splits to fixed length.", paradigm=False
    )
    setup_logging()
    config = load_params(args.params).section(f"tokenizer.{args.task}", TokenizerConfig)
    layout = Layout(args.root, args.task)
    splits = read_raw_splits(layout.raw)

    tokenizer = make_tokenizer(config, splits["train"], args.task)
    tokenizer_json = tokenizer.to_str().encode("utf-8")
    write_bytes(layout.tokenizer, tokenizer_json)
    write_text(layout.tokenizer.with_name(SPECIAL_MAP_FILE), tokenizer.special_map_str())

    manifest: dict[str, Any] = {
        "task": args.task,
        "config": to_dict(config),
        "seq_len": config.seq_len,
        "vocab_size": tokenizer.vocab_size,
        "special_ids": {tokenizer.special[role]: tokenizer.id_of(role) for role in ROLES},
        "tokenizer_sha256": sha256_bytes(tokenizer_json),
        "splits": {},
    }
    for name, records in splits.items():
        split = encode_examples(records, tokenizer, config.seq_len, args.task)
        logger.info(
            "%s/%s: %d rows, %d dropped (too long for seq_len, or text's incomplete last row)",
            *(args.task, name, split.tokens.shape[0], split.n_dropped),
        )
        manifest["splits"][name] = {
            "path": f"{name}.npz",
            "count": int(split.tokens.shape[0]),
            "n_dropped": split.n_dropped,
            "n_tokens": int(split.length.sum()),
            "sha256": write_split(layout.encoded(name), split),
        }
    write_json(layout.encoded("manifest").with_suffix(".json"), manifest)
    logger.info(
        "wrote %s: %s",
        layout.encoded("manifest").parent,
        {k: v["count"] for k, v in manifest["splits"].items()},
    )


if __name__ == "__main__":
    main(sys.argv[1:])
