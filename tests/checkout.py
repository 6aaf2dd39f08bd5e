"""A scratch copy of this checkout as a fresh git repository, for end-to-end `dvc repro` tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def env(repo: Path) -> dict[str, str]:
    """ENV running `repo`'s own code: the editable install maps `setdiff` (the console script
    DVC stages call) to the live checkout, which others may be editing meanwhile."""
    return {**ENV, "PYTHONPATH": str(repo)}


def sh(*cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env(cwd), check=check, capture_output=True, text=True)


OUTPUTS = ("data", "models", "metrics", "checkpoints", "results", "ablations")
"""Pipeline outputs: a copy leaves them out (the committed metrics of the default run too), so a
test's run starts from nothing."""


def copy_checkout(dest: Path) -> Path:
    """A git repository at `dest` holding the tracked (and untracked, unignored) files of this
    checkout: no data, models, metrics or results."""
    files = sh("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).stdout.split()
    for name in files:
        if name.split("/")[0] in OUTPUTS:
            continue
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for p in OUTPUTS:
        assert not (dest / p).exists()
    sh("git", "init", "-q", cwd=dest)
    sh("git", "add", "-A", cwd=dest)
    sh("git", "commit", "-qm", "copy", cwd=dest)
    return dest
