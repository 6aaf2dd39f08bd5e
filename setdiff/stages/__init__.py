"""Pipeline stages: each module parses --params and paths, calls the library, writes outputs.

Every module here but `common` is a stage, ``setdiff <name>`` (`setdiff.cli`); its docstring's
first line is its help line. What a stage owns beyond its command it declares as data in its
module, so that adding a stage edits no central list:

- ``SECTION = "<key>"``: the top-level params section it owns, and ``check_preset(preset,
  study)``, its part of preset validation (`setdiff.validate` accepts the key and calls it);
- ``STUDY = "<key>"``: ``study.<key>`` lists the tasks it runs on (dvc.yaml's ``foreach``),
  with ``STUDY_TASKS`` (``"answers"`` or ``"stream"``: which tasks it may list) and
  ``STUDY_PARADIGMS`` (what the study must train when it lists one);
- ``THREADS = ("<key>.threads", ...)``: the threads it computes on (`flows.lanes` reads them
  from the source, to run it beside other stages).
"""

from __future__ import annotations

import pkgutil


def stage_names() -> list[str]:
    """Every stage, sorted: this package's modules but `common` (what the stages share). Found
    without importing them."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common")
