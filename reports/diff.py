"""Two runs side by side: ``python -m reports.diff <dirA> <dirB> --out reports/out/diff``.

Each directory is a run root holding ``results/`` and ``metrics/`` (and optionally ``models/``,
``params.yaml``, ``dvc.lock``), e.g. two presets or two git revisions. Writes ``report.md``,
``report.html`` and ``figures/*.png``: the two runs' provenance, a `dvc metrics diff`-style
table over every ``metrics/**/*.json`` number, accuracy and tokens/s per configuration in both
runs, and the trade-off and training figures with both runs overlaid (A solid, B dashed).

When A holds a seeds study (``metrics/seeds/<task>.json``), each paradigm's accuracy in B is
checked against A's seed spread (the seeds' accuracies and A's own, min to max): a value outside
it is flagged in the table and logged, so a second machine's run says at once which of its
numbers differ by more than training variance explains.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from reports.build import (
    git_revision,
    item_blocks,
    missing_blocks,
    png_writer,
    report_date,
    write_report,
)
from reports.inputs.run import Run, flatten_metrics, load_run
from reports.items import ITEMS, Derived, Item, derive, make_items
from reports.render import tables
from reports.render.document import Block, Heading, Table, Text
from reports.render.style import set_theme

log = logging.getLogger(__name__)

OVERLAID = ("quality_vs_throughput", "quality_vs_tokens_per_forward", "quality_vs_latency")


def run_labels(roots: Sequence[Path]) -> tuple[str, str]:
    """Short labels of two runs: their directory names, or A / B when those coincide."""
    names = [Path(r).resolve().name or str(r) for r in roots]
    return (names[0], names[1]) if names[0] != names[1] else ("A", "B")


def _tagged(frames: Sequence[pd.DataFrame], labels: Sequence[str]) -> pd.DataFrame:
    tagged = [f.assign(run=label) for f, label in zip(frames, labels, strict=True) if not f.empty]
    return pd.concat(tagged, ignore_index=True) if tagged else pd.DataFrame()


def merge(runs: Sequence[Derived], labels: Sequence[str]) -> Derived:
    """One `Derived` holding both runs, every frame tagged with a ``run`` column."""

    def field(name: str) -> pd.DataFrame:
        return _tagged([getattr(d.run, name) for d in runs], labels)

    missing = [
        dataclasses.replace(m, path=f"{label}: {m.path}")
        for d, label in zip(runs, labels, strict=True)
        for m in d.run.missing
    ]
    names = [f.name for f in dataclasses.fields(Run) if f.type == "pd.DataFrame"]
    run = Run(root=runs[0].run.root, params={}, missing=missing, **{n: field(n) for n in names})
    return Derived(
        run=run,
        points=_tagged([d.points for d in runs], labels),
        orders=_tagged([d.orders for d in runs], labels),
        sizes=_tagged([d.sizes for d in runs], labels),
    )


def compare_items(metrics_diff: pd.DataFrame, labels: tuple[str, str]) -> tuple[Item, ...]:
    """The comparison's figures and tables (overlays reuse the report's items)."""
    by_name = {item.name: item for item in ITEMS}
    return (
        Item(
            name="metrics_diff",
            title="Metrics diff",
            section="Metrics",
            needs=("evaluate", "train", "tradeoff", "textgen"),
            make=lambda d: metrics_diff,
            caption=f"Every number in `metrics/**/*.json` that differs ({labels[0]} → "
            f"{labels[1]}); rows present in one run only have one value.",
        ),
        Item(
            name="points_diff",
            title="Accuracy and tokens/s per configuration",
            section="Speed–quality trade-offs",
            needs=("bench", "baseline"),
            make=lambda d: None if d.points.empty else tables.points_diff_table(d.points, labels),
            caption=f"speed ratio = tokens/s of {labels[1]} / tokens/s of {labels[0]}.",
        ),
        *(dataclasses.replace(by_name[n], section="Speed–quality trade-offs") for n in OVERLAID),
        dataclasses.replace(
            by_name["training_curves"], caption=f"{labels[0]} solid, {labels[1]} dashed."
        ),
    )


def seed_spread_table(a: pd.DataFrame, b: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """Per (task, paradigm) of A's seeds study: A's and B's test accuracy, A's seed range (its
    seeds, and its own run where that model trained the study's steps), and whether B's accuracy
    lies outside it (judged only where B's model trained the study's steps too).

    Args:
        a, b: `reports.inputs.run.flatten_metrics` frames of the reference run A and of B.
        seeds: `Run.seeds` of A (one row per task and paradigm, with ``accuracies``).
    """

    def value(frame: pd.DataFrame, path: str, key: str) -> float | None:
        hit = frame[(frame["path"] == path) & (frame["key"] == key)]["value"]
        return float(hit.iloc[0]) if len(hit) else None

    def accuracy(frame: pd.DataFrame, task: str, paradigm: str) -> float | None:
        return value(frame, f"metrics/evaluate/{task}/{paradigm}.json", "accuracy")

    def same_steps(frame: pd.DataFrame, row: Any) -> bool:
        """Whether the run's model trained as many steps as the seeds study's (unknown: yes)."""
        steps = value(frame, f"metrics/train/{row.task}/{row.paradigm}.json", "steps")
        theirs = getattr(row, "steps", None)
        return steps is None or theirs is None or pd.isna(theirs) or steps == theirs

    rows = []
    for row in seeds.itertuples(index=False):
        own = accuracy(a, row.task, row.paradigm) if same_steps(a, row) else None
        spread = [float(x) for x in row.accuracies] + ([] if own is None else [own])
        low, high = min(spread), max(spread)
        other = accuracy(b, row.task, row.paradigm)
        # a range of another recipe's steps says nothing of B's model
        outside = (
            None
            if other is None or not same_steps(b, row)
            else not (low - 1e-9 <= other <= high + 1e-9)
        )
        rows.append(
            {
                "task": row.task,
                "paradigm": row.paradigm,
                "A": tables.fmt(own, ".3f"),
                "B": tables.fmt(other, ".3f"),
                "A's seed range": f"{low:.3f}–{high:.3f} ({len(spread)} runs)",
                "B outside it": {None: "–", True: "**yes**", False: "no"}[outside],
            }
        )
    return pd.DataFrame(rows)


def runs_table(runs: Sequence[Derived], labels: Sequence[str]) -> pd.DataFrame:
    """Provenance of both runs side by side."""

    def describe(d: Derived) -> dict[str, str]:
        prints = d.run.fingerprints
        first = prints.drop_duplicates("key").set_index("key")["value"] if len(prints) else {}
        return {
            "directory": str(d.run.root.resolve()),
            "params preset": d.run.preset or "unknown",
            "checkout revision": git_revision(d.run.root),
            **{k: tables.fmt(first.get(k)) for k in ("git_revision", "params_hash")},
            **{
                k: tables.fmt(first.get(k))
                for k in (
                    "device",
                    "device_name",
                    "cpu_model",
                    "cpu_count",
                    "threads",
                    "torch",
                    "python",
                )
            },
            "configurations measured": str(len(d.points)),
            "missing inputs": str(len(d.run.missing)),
        }

    columns = {label: describe(d) for d, label in zip(runs, labels, strict=True)}
    return pd.DataFrame(columns).rename_axis("field").reset_index()


def compare(
    root_a: Path, root_b: Path, out: Path, labels: tuple[str, str] | None = None
) -> list[Block]:
    """Load both runs, build the comparison, write it under `out`."""
    labels = labels or run_labels([root_a, root_b])
    runs = [derive(load_run(root)) for root in (root_a, root_b)]
    metrics = [flatten_metrics(root) for root in (root_a, root_b)]
    diff = tables.metrics_diff_table(*metrics, labels)
    if diff.empty and any(len(m) for m in metrics):
        same = f"all {max(len(m) for m in metrics)} metrics are equal in both runs"
        diff = pd.DataFrame({"path": ["(all)"], "metric": [same]})
    merged = merge(runs, labels)
    spread = (
        seed_spread_table(*metrics, runs[0].run.seeds)
        if not runs[0].run.seeds.empty
        else pd.DataFrame()
    )
    for _, row in spread[spread["B outside it"] == "**yes**"].iterrows() if len(spread) else ():
        log.warning(
            "%s %s: %s's accuracy %s is outside %s's seed range %s",
            *(row["task"], row["paradigm"], labels[1], row["B"], labels[0], row["A's seed range"]),
        )
    made = make_items(merged, compare_items(diff, labels))
    png = png_writer(out / "figures")
    blocks: list[Block] = [
        Heading(f"Comparison: {labels[0]} vs {labels[1]}", 1),
        Text(f"Built {report_date()}. {labels[0]} is drawn solid, {labels[1]} dashed."),
        Heading("Runs"),
        Table(runs_table(runs, labels)),
        *(
            [
                Heading("Against the seed spread"),
                Text(
                    f"{labels[1]}'s test accuracy beside {labels[0]}'s seed range (its seeds "
                    "study and its own run): outside it is more than training variance."
                ),
                Table(spread.rename(columns={"A": labels[0], "B": labels[1]})),
            ]
            if len(spread)
            else []
        ),
        *missing_blocks(merged.run, made),
    ]
    for section in dict.fromkeys(m.item.section for m in made):
        blocks.append(Heading(section))
        for m in (m for m in made if m.item.section == section):
            blocks += item_blocks(m, merged.run, png)
    write_report(blocks, out, f"Comparison {labels[0]} vs {labels[1]}")
    return blocks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path, help="first run root (results/, metrics/)")
    parser.add_argument("run_b", type=Path, help="second run root")
    parser.add_argument("--out", type=Path, default=Path("reports/out/diff"))
    parser.add_argument("--labels", nargs=2, metavar=("A", "B"), help="names of the two runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    set_theme()
    compare(args.run_a, args.run_b, args.out, tuple(args.labels) if args.labels else None)
    log.info("wrote %s", args.out / "report.md")


if __name__ == "__main__":
    main()
