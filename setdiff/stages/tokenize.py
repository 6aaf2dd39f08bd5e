"""Train a task's tokenizer and encode its splits to fixed-length arrays.

DVC stage ``tokenize``.

``setdiff tokenize --task arith [--params params.yaml] [--root .]`` reads ``tokenizer.<task>``
and ``data/<task>/raw/*.jsonl`` (from ``prepare``), trains the tokenizer on the train split (or
loads a pretrained one, ``kind: pretrained``), and writes ``data/<task>/tokenizer/tokenizer.json``
with its roles in ``special_tokens_map.json``, ``data/<task>/encoded/{split}.npz`` (keys
``tokens``, ``context_len``, ``length``; the ``np.savez`` format, written with fixed zip
timestamps so equal arrays give equal bytes) and ``data/<task>/encoded/manifest.json``.
Nothing is written until every split is encoded and checked; then each of the two directories
is replaced whole and atomically, so a failed run leaves the previous outputs as they were.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from setdiff.config import to_dict
from setdiff.files import atomic_dir, sha256_bytes
from setdiff.stages.common import Layout, start
from setdiff.tasks import TASK_LAYOUTS, read_records
from setdiff.tasks.records import SPLIT_NAMES, Record, Splits
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

PARAMS: tuple[str, ...] = ("tokenizer.{task}",)
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

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


def read_raw_splits(raw_dir: Path, task: str) -> Splits:
    """The jsonl splits written by ``prepare``; a clear error if one is missing, malformed or
    empty."""
    splits = {name: read_records(raw_dir / f"{name}.jsonl", task) for name in SPLIT_NAMES}
    empty = [str(raw_dir / f"{name}.jsonl") for name, records in splits.items() if not records]
    if empty:
        raise ValueError(f"{', '.join(empty)}: empty (no records); run `setdiff prepare` again")
    return splits


def split_payload(split: EncodedSplit, source: Path, task: str) -> bytes:
    """The npz bytes of one encoded split.

    Raises:
        ValueError: if the split has no rows: a text split too short for one row, or prompt/target
            examples that are all longer than seq_len.
    """
    seq_len = split.tokens.shape[1]
    if split.tokens.shape[0] == 0 and TASK_LAYOUTS[task] == "stream":
        raise ValueError(
            f"{source}: too short: its text does not fill one row of seq_len={seq_len} tokens; "
            f"add text or lower tokenizer.{task}.seq_len"
        )
    if split.tokens.shape[0] == 0:
        raise ValueError(
            f"{source}: no example fits seq_len={seq_len} ({split.n_dropped} dropped); "
            f"raise tokenizer.{task}.seq_len"
        )
    return npz_bytes(
        {"tokens": split.tokens, "context_len": split.context_len, "length": split.length}
    )


def make_tokenizer(config: TokenizerConfig, train: list[Record], task: str) -> Tokenizer:
    """Train the task's tokenizer on its train records, or load the pretrained one."""
    if config.kind == "pretrained":
        from setdiff.hf import load_pretrained_tokenizer

        return load_pretrained_tokenizer(config)
    return Tokenizer(train_tokenizer(training_texts(train, task), config))


def write_outputs(
    layout: Layout, tokenizer: Tokenizer, payloads: dict[str, bytes], manifest: dict[str, Any]
) -> None:
    """Replace the encoded and tokenizer directories, each whole and atomically."""
    with atomic_dir(layout.encoded("manifest").parent) as encoded:
        for name, payload in payloads.items():
            (encoded / f"{name}.npz").write_bytes(payload)
        manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        (encoded / "manifest.json").write_text(manifest_text)
    with atomic_dir(layout.tokenizer.parent) as directory:
        (directory / layout.tokenizer.name).write_text(tokenizer.to_str(), encoding="utf-8")
        (directory / SPECIAL_MAP_FILE).write_text(tokenizer.special_map_str())


def main(argv: list[str]) -> None:
    """Train ``--task``'s tokenizer on its train split and encode all three splits."""
    args, preset, layout = start(
        argv, "Train a task's tokenizer and encode its splits to fixed length."
    )
    config = preset.section(f"tokenizer.{args.task}", TokenizerConfig)
    splits = read_raw_splits(layout.raw, args.task)

    tokenizer = make_tokenizer(config, splits["train"], args.task)
    tokenizer_json = tokenizer.to_str().encode("utf-8")
    manifest: dict[str, Any] = {
        "task": args.task,
        "config": to_dict(config),
        "seq_len": config.seq_len,
        "vocab_size": tokenizer.vocab_size,
        "special_ids": {tokenizer.special[role]: tokenizer.id_of(role) for role in ROLES},
        "tokenizer_sha256": sha256_bytes(tokenizer_json),
        "splits": {},
    }
    payloads = {}
    for name, records in splits.items():
        split = encode_examples(records, tokenizer, config.seq_len, args.task)
        logger.info(
            "%s/%s: %d rows, %d dropped (too long for seq_len, or text's incomplete last row)",
            *(args.task, name, split.tokens.shape[0], split.n_dropped),
        )
        payloads[name] = split_payload(split, layout.raw / f"{name}.jsonl", args.task)
        manifest["splits"][name] = {
            "path": f"{name}.npz",
            "count": int(split.tokens.shape[0]),
            "n_dropped": split.n_dropped,
            "n_tokens": int(split.length.sum()),
            "sha256": sha256_bytes(payloads[name]),
        }
    # Written only once everything is computed and checked: a failed run leaves the previous
    # tokenizer and encodings as they were, side by side.
    write_outputs(layout, tokenizer, payloads, manifest)
    logger.info(
        "wrote %s: %s",
        layout.encoded("manifest").parent,
        {k: v["count"] for k, v in manifest["splits"].items()},
    )


if __name__ == "__main__":
    main(sys.argv[1:])
