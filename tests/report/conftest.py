"""Fixtures of the report tests: one synthetic run per module (`report_run.write_run`), derived
and built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from report.report_run import write_run
from reports.build import main
from reports.inputs.run import load_run
from reports.items import Derived, derive
from reports.render.style import set_theme


@pytest.fixture(scope="module", autouse=True)
def theme() -> None:
    set_theme()


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def derived(run_root: Path) -> Derived:
    return derive(load_run(run_root))


@pytest.fixture(scope="module")
def built(run_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out")
    main(["--root", str(run_root), "--out", str(out)])
    return out
