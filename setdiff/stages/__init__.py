"""Pipeline stages: each module parses --params and paths, calls the library, writes outputs.

Every module here but `common` is a stage, ``setdiff <name>`` (`setdiff.cli`); its docstring's
first line is its help line.
"""

from __future__ import annotations

import pkgutil


def stage_names() -> list[str]:
    """Every stage, sorted: this package's modules but `common` (what the stages share). Found
    without importing them."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common")
