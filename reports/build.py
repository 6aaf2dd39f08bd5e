"""DVC stage ``report``: artifacts -> ``reports/out/{report.md, report.html, figures/*.png}``.

``python -m reports.build [--root .] [--out reports/out]``. Reads only the run's tidy results
(`reports.inputs.run`); every figure and table is an `Item` that names the input kinds it needs,
so a missing or partial input is listed under "Missing inputs" with exactly the items it disabled
(or left incomplete), and each disabled item says so where it would have been.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from reports.analysis.findings import findings
from reports.inputs.run import KINDS, Run, load_run
from reports.items import PROVENANCE, SECTIONS, Derived, Made, derive, make_items
from reports.render import tables
from reports.render.document import (
    Block,
    Bullets,
    Code,
    Heading,
    Image,
    Table,
    Text,
    figure_png,
    render_html,
    render_markdown,
)
from reports.render.style import set_theme

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("preset",)
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""


def affects(run: Run, made: Sequence[Made]) -> list[str]:
    """Per missing input: the items that read its kind, marked disabled or incomplete."""
    out = []
    for missing in run.missing:
        names = [
            f"{m.item.title} ({'incomplete' if m.output is not None else 'disabled'})"
            for m in made
            if missing.kind in m.item.needs
        ]
        out.append("; ".join(names) or "no figure or table of this report")
    return out


def missing_blocks(run: Run, made: Sequence[Made]) -> list[Block]:
    """The "Missing inputs" section: every missing/partial input and failed item."""
    blocks: list[Block] = [Heading("Missing inputs")]
    failed = [m for m in made if m.error]
    if not run.missing and not failed:
        return blocks + [Text("All expected inputs were found and every item was built.")]
    if run.missing:
        frame = tables.missing_table(run.missing, affects(run, made))
        blocks.append(Table(frame, f"{len(run.missing)} input(s) missing, empty or partial:"))
    if failed:
        blocks.append(Bullets(tuple(f"`{m.item.name}` failed: {m.error}" for m in failed)))
    return blocks


def item_blocks(made: Made, run: Run, png: Callable[[str, Figure], bytes]) -> list[Block]:
    """An item's heading and its figure / table, or a line saying why it is not there."""
    item, output = made.item, made.output
    if isinstance(output, Figure):
        return [Heading(item.title, 3), Image(item.name, png(item.name, output), item.caption)]
    if isinstance(output, pd.DataFrame) and not output.empty:
        return [Heading(item.title, 3), Table(output, item.caption, folded=item.folded)]
    if made.error:
        return [Heading(item.title, 3), Text(f"**Not available: failed** ({made.error}).")]
    paths = [m.path for m in run.missing if m.kind in item.needs] or [KINDS[k] for k in item.needs]
    why = ", ".join(f"`{p}`" for p in paths)
    return [Heading(item.title, 3), Text(f"**Not available:** needs {why} (see Missing inputs).")]


def git_revision(root: Path) -> str:
    """HEAD of the checkout at `root` (``-dirty`` with uncommitted changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty.returncode else "")


def report_date() -> str:
    """UTC now, or ``SOURCE_DATE_EPOCH`` when set (reproducible builds)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%d %H:%M UTC")


def provenance_blocks(run: Run, revision: str, date: str) -> list[Block]:
    """Revision, preset, date and the command that reproduces the run."""
    produced = sorted(set(run.fingerprints.query("key == 'git_revision'")["value"].astype(str)))
    preset = run.preset or "unknown (params.yaml missing)"
    return [
        Bullets(
            (
                f"Report built: {date}",
                f"Git revision of this checkout: `{revision}`",
                "Results produced at: " + (", ".join(f"`{r}`" for r in produced) or "unknown"),
                f"Params preset: `{preset}`",
            )
        ),
        Text("How to reproduce:"),
        Code(f"setdiff preset {run.preset or '<preset>'} && dvc repro"),
    ]


def summary_blocks(d: Derived, revision: str, date: str) -> list[Block]:
    """Title and one line on what the report covers."""
    run = d.run
    tasks = sorted(set(run.rows.get("task", [])) | set(run.evaluate.get("task", [])))
    series = list(dict.fromkeys(d.points.get("series", [])))
    shows = findings(run.evaluate, run.comparisons, run.backbone, run.setsize, run.fingerprints)
    return [
        Heading(f"Trade-off report: preset `{run.preset or 'unknown'}`", 1),
        Heading("What this run shows"),
        Bullets(tuple(shows)) if shows else Text("No accuracy or speed result was found."),
        Text(
            f"Built {date} at `{revision}`. Tasks: {', '.join(tasks) or 'none'}. "
            f"Series: {', '.join(series) or 'none'}. "
            f"{len(d.points)} measured configurations; {len(run.missing)} missing or partial "
            "input(s) (listed below)."
        ),
    ]


def compose(d: Derived, made: Sequence[Made], png: Callable[[str, Figure], bytes]) -> list[Block]:
    """The whole report as blocks, sections in `SECTIONS` order."""
    revision, date = git_revision(d.run.root), report_date()
    blocks = summary_blocks(d, revision, date) + missing_blocks(d.run, made)
    for section in SECTIONS:
        blocks.append(Heading(section))
        if section == PROVENANCE:
            blocks += provenance_blocks(d.run, revision, date)
        for m in made:
            if m.item.section == section:
                blocks += item_blocks(m, d.run, png)
    return blocks


def write_report(blocks: list[Block], out: Path, title: str) -> None:
    """report.md (figures linked) and report.html (figures embedded) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(blocks, "figures"), encoding="utf-8")
    (out / "report.html").write_text(render_html(blocks, title), encoding="utf-8")


def png_writer(figure_dir: Path) -> Callable[[str, Figure], bytes]:
    """A callback that renders a figure once and writes ``<figure_dir>/<name>.png``.

    Stale PNGs from an earlier build are removed first, so the folder holds this report's only.
    """
    figure_dir.mkdir(parents=True, exist_ok=True)
    for old in figure_dir.glob("*.png"):
        old.unlink()

    def write(name: str, fig: Figure) -> bytes:
        data = figure_png(fig)
        (figure_dir / f"{name}.png").write_bytes(data)
        return data

    return write


def build(root: Path, out: Path) -> list[Block]:
    """Load the run at `root`, build every item, write the report under `out`."""
    derived = derive(load_run(root))
    made = make_items(derived)
    blocks = compose(derived, made, png_writer(out / "figures"))
    write_report(blocks, out, f"Trade-off report ({derived.run.preset or 'unknown preset'})")
    for missing in derived.run.missing:
        log.warning("missing input %s: %s", missing.path, missing.problem)
    return blocks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="run root (default: .)")
    parser.add_argument("--out", type=Path, default=Path("reports/out"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    set_theme()
    build(args.root, args.out)
    log.info("wrote %s", args.out / "report.md")


if __name__ == "__main__":
    main()
