"""The pipeline flow: the whole study as DVC stages, in dvc.yaml order, one task per stage.

A front end over ``dvc repro`` (orchestration runs one way, DVC runs the flow: see `flows`): it
adds no graph, ordering or caching of its own.

Each task runs ``dvc repro <stage>``: DVC is the cache and decides what re-runs; Prefect is the
scheduler (retries for infrastructure faults, logs and states in the UI). Result persistence
stays off: DVC already keeps every output. With ``preset`` it first activates that preset
(``setdiff preset <name>``). Stages are not wrapped in the compute concurrency limit: they run
one at a time, and the ``ablate`` stage's own flow takes the limit for each of its trials.

Run it: ``python -m flows.pipeline [--preset smoke] [--stages prepare tokenize ...]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import yaml
from prefect import flow

from flows.tasks import DVC, SETDIFF, run_cli, run_stage


@flow(name="pipeline")
def pipeline(
    preset: str | None = None,
    stages: list[str] | None = None,
    root: str = ".",
    dvc: list[str] | None = None,
) -> list[str]:
    """Activate `preset` (optional), then ``dvc repro`` each stage in order; returns them."""
    names = stages or stage_names(Path(root) / "dvc.yaml")
    if preset is not None:
        log_path = str(Path(root) / ".dvc" / "tmp" / "flows" / "preset.log")
        argv = [*SETDIFF, "preset", preset]
        run_cli(f"setdiff preset {preset}", argv, log_path=log_path, cwd=root)
    for name in names:
        run_stage(name, cwd=root, dvc=dvc or DVC)
    return names


def stage_names(dvc_yaml: Path) -> list[str]:
    """The top-level stages of dvc.yaml, in file order."""
    return list(yaml.safe_load(dvc_yaml.read_text())["stages"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="activate params/<preset>.yaml first")
    parser.add_argument("--stages", nargs="+", help="stages to reproduce (default: all)")
    parser.add_argument("--root", default=".")
    args = parser.parse_args(argv)
    print(" ".join(pipeline(preset=args.preset, stages=args.stages, root=args.root)))


if __name__ == "__main__":
    main()
