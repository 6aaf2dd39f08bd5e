"""reports.build and reports.diff: the built report (Markdown, self-contained HTML, offline in a
browser), every item building, two runs side by side, and the package's layering."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from matplotlib.figure import Figure
from PIL import Image

from report.report_run import (
    PARADIGMS,
    REPO,
    by_gid,
    check_self_contained_html,
    legend_labels,
    write_run,
)
from reports.diff import compare, merge, seed_spread_table
from reports.inputs.run import flatten_metrics, load_run
from reports.items import Derived, derive, make_items
from reports.render import figures, tables


def test_reports_never_import_torch_or_setdiff() -> None:
    for path in sorted((REPO / "reports").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad = [n for n in names if n.split(".")[0] in ("torch", "setdiff")]
            assert not bad, f"{path.name} imports {bad}"
    code = (
        "import sys, reports.build, reports.diff; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'setdiff')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_dvc_report_stage_reads_every_report_module() -> None:
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].get("report")
    if stage is None:
        pytest.skip("dvc.yaml has no report stage yet")
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "reports").rglob("*.py")} - {
        "reports/diff.py"  # not run by the stage
    }
    assert stage["cmd"] == "python -m reports.build"
    deps = set(stage["deps"])
    uncovered = {m for m in modules if not deps & {m, *map(str, Path(m).parents)}}
    assert not uncovered, sorted(uncovered)  # each module, or a folder holding it, is a dep
    assert stage["outs"] == ["reports/out"]


def test_build_writes_markdown_html_and_figures(built: Path, derived: Derived) -> None:
    pngs = sorted(p.stem for p in (built / "figures").glob("*.png"))
    expected = sorted(m.item.name for m in make_items(derived) if isinstance(m.output, Figure))
    assert pngs == expected
    assert check_self_contained_html(built / "report.html") == len(pngs)
    md = (built / "report.md").read_text()
    for png in pngs:
        assert f"](figures/{png}.png)" in md
    for heading in (
        "## Missing inputs",
        "## Speed–quality trade-offs",
        "## Provenance",
        "### Speedup at matched accuracy",
        "### Perplexity",
        "### Text generation",
    ):
        assert heading in md
    assert "Not available" not in md
    assert "setdiff preset test && dvc repro" in md
    assert "`rev0`" in md and "| bench@arith | 1 | 1 |" in md and "2.13.0+cpu" in md
    assert "metrics/tradeoff/arith.json#setdlm_vs_bd3lm | missing: no bd3lm rows" in md


def test_every_item_builds_without_error(derived: Derived) -> None:
    made = make_items(derived)
    assert [m.item.name for m in made if m.error or m.output is None] == []


def test_compare_overlays_two_runs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=0, preset="smoke")
    b = write_run(tmp_path / "b", seed=1, speed=0.5, preset="default")
    out = tmp_path / "cmp"
    compare(a, b, out)
    md = (out / "report.md").read_text()
    assert "| params preset | smoke | default |" in md
    assert "| git_revision | rev0 | rev1 |" in md
    diff = tables.metrics_diff_table(flatten_metrics(a), flatten_metrics(b), ("a", "b"))
    assert len(diff) and f"| {diff.iloc[0]['path']} | {diff.iloc[0]['metric']} |" in md
    assert "Accuracy and tokens/s per configuration" in md and "Not available" not in md
    n_images = check_self_contained_html(out / "report.html")
    assert n_images == len(list((out / "figures").glob("*.png"))) == 4
    merged = merge([derive(load_run(a)), derive(load_run(b))], ("a", "b"))
    ax = figures.plot_quality_vs_throughput(merged.points).axes[0]
    dots = by_gid(ax.lines, "points:arith:")
    assert {"setdlm (a)", "setdlm (b)", "ar (a)", "ar (b)"} <= set(dots)
    fronts = by_gid(ax.lines, "frontier:arith:")
    assert fronts["setdlm (a)"].get_linestyle() != fronts["setdlm (b)"].get_linestyle()
    assert set(legend_labels(ax)) >= {f"{p} ({r})" for p in PARADIGMS for r in "ab"}


def test_compare_flags_accuracies_outside_the_reference_seed_spread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B's accuracy is checked against A's seeds and A's own run, min to max, inclusive."""

    def frame(values: dict[str, float]) -> pd.DataFrame:
        rows = [(f"metrics/evaluate/arith/{p}.json", "accuracy", v) for p, v in values.items()]
        return pd.DataFrame(rows, columns=["path", "key", "value"])

    a = frame({"setdlm": 0.90, "bd3lm": 0.86, "mdlm": 0.66})
    b = frame({"setdlm": 0.91, "bd3lm": 0.938, "mdlm": 0.66})
    seeds = pd.DataFrame(
        {
            "task": ["arith"] * 3,
            "paradigm": ["setdlm", "bd3lm", "mdlm"],
            "accuracies": [[0.88, 0.92], [0.85, 0.87], [0.60, 0.62]],
        }
    )
    table = seed_spread_table(a, b, seeds).set_index("paradigm")
    assert table.loc["setdlm", "B outside it"] == "no"  # inside 0.88-0.92
    assert table.loc["bd3lm", "B outside it"] == "**yes**"  # above 0.85-0.87
    assert table.loc["mdlm", "B outside it"] == "no"  # the boundary (A's own run) is inside
    assert table.loc["bd3lm", "A's seed range"] == "0.850–0.870 (3 runs)"
    missing = seed_spread_table(a, frame({}), seeds).set_index("paradigm")
    assert set(missing["B outside it"]) == {"–"}

    # A seeds study of another recipe's steps: A's own run leaves the range, B is not judged.
    def steps(frame_: pd.DataFrame, paradigm: str, n: int) -> pd.DataFrame:
        row = (f"metrics/train/arith/{paradigm}.json", "steps", n)
        return pd.concat([frame_, pd.DataFrame([row], columns=frame_.columns)], ignore_index=True)

    seeds["steps"] = [2000, 1200, 2400]
    longer = seed_spread_table(steps(a, "mdlm", 4800), steps(b, "bd3lm", 2400), seeds).set_index(
        "paradigm"
    )
    assert longer.loc["mdlm", "A's seed range"] == "0.600–0.620 (2 runs)"
    assert longer.loc["mdlm", "B outside it"] == "**yes**"  # B's steps unknown: compared
    assert longer.loc["bd3lm", "B outside it"] == "–"  # B trained 2400, the seeds 1200
    assert longer.loc["setdlm", "B outside it"] == "no"  # no steps recorded: compared

    # In the comparison report: the section, and one log line per flagged paradigm.
    run_a = write_run(tmp_path / "a", seed=0, preset="smoke")
    run_b = write_run(tmp_path / "b", seed=1, speed=0.5, preset="default")
    for run, value in ((run_a, 0.90), (run_b, 0.95)):
        path = run / "metrics/evaluate/arith/setdlm.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "accuracy": value}))
    seeds_file = run_a / "metrics" / "seeds" / "arith.json"
    seeds_file.parent.mkdir(parents=True, exist_ok=True)
    row = {"seeds": [1, 2], "accuracies": [0.88, 0.91], "n": 2, "mean": 0.895}
    seeds_file.write_text(json.dumps({"task": "arith", "paradigms": {"setdlm": row}}))
    with caplog.at_level("WARNING", logger="reports.diff"):
        compare(run_a, run_b, tmp_path / "cmp")
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "## Against the seed spread" in md
    assert "| arith | setdlm | 0.900 | 0.950 | 0.880–0.910 (3 runs) | **yes** |" in md
    flagged = [r.message for r in caplog.records if "outside" in r.message]
    assert flagged == [
        "arith setdlm: b's accuracy 0.950 is outside a's seed range 0.880–0.910 (3 runs)"
    ]


CHECK_IMAGES = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const ok = images.filter(i => i.complete && i.naturalWidth > 0).length;
  const out = document.createElement("pre");
  out.textContent = `RENDERED ${ok} OF ${images.length}`;
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)"
)
def test_html_renders_offline_in_headless_chromium(built: Path, tmp_path: Path) -> None:
    """Every embedded image decodes in a real browser with all networking disabled."""
    page = tmp_path / "check.html"
    page.write_text(
        (built / "report.html").read_text().replace("</body>", CHECK_IMAGES + "</body>")
    )
    command = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    n = len(list((built / "figures").glob("*.png")))
    assert f"RENDERED {n} OF {n}" in dom
    # A screenshot of the report itself, as a reader sees it: a page with text and figures.
    shot = tmp_path / "report.png"
    screenshot = [c for c in command if c not in ("--dump-dom", page.as_uri())]
    screenshot += [
        "--window-size=1280,4000",
        f"--screenshot={shot}",
        (built / "report.html").as_uri(),
    ]
    subprocess.run(screenshot, capture_output=True, timeout=120, check=True)
    with Image.open(shot) as image:
        assert image.size == (1280, 4000)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # not a blank or error page


def test_report_opens_with_what_the_run_shows(built: Path) -> None:
    text = (built / "report.md").read_text()
    assert text.index("What this run shows") < text.index("Speed")
    assert "setdlm decodes 1.80×" in text
    assert "setdlm at other set sizes on arith: D = 2, W = 2: 0.930 [" in text


def test_report_has_the_set_size_table(built: Path) -> None:
    text = (built / "report.md").read_text()
    section = text[text.index("Set size") :]
    assert "0.930 [0.886, 0.958]" in section[:3000] and "main run" in section[:3000]
