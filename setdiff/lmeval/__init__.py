"""lm-evaluation-harness (0.4.x) integration: the ``setdiff`` model type and our answer tasks.

lm-eval has no plugin discovery for models (its own maintainers' workaround is to import the
module that calls ``register_model`` before evaluating), so the model type is registered through
lm-eval's registry when this package is imported, as a lazy placeholder (the adapter and torch
load only when ``setdiff`` is asked for):

    import lm_eval, setdiff.lmeval
    lm_eval.simple_evaluate(model="setdiff", model_args="path=models/arith/setdlm,window=4",
                            tasks=["setdiff_arith"], task_manager=setdiff.lmeval.task_manager())

On the command line, ``python -m setdiff.lmeval`` is lm-eval's own CLI with the model registered
and our task directory included: ``python -m setdiff.lmeval --model setdiff --model_args
path=models/arith/setdlm,window=4,threshold=0.9 --tasks setdiff_arith``.

Tasks (``tasks/*.yaml``): ``setdiff_arith``, ``setdiff_gsm``, ``setdiff_gsm8k`` read the pipeline's
local test split ``<root>/data/<task>/raw/test.jsonl`` (``root`` from lm-eval's ``--metadata``,
default the working directory; never the hub) and score with lm-eval's own regex extraction and
``exact_match``. Named with a ``setdiff_`` prefix so they never shadow lm-eval's ``gsm8k``.

Needs the optional extra: ``pip install -e '.[eval]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_NAME = "setdiff"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
"""lm-eval task YAMLs for our answer tasks (pass as ``include_path``)."""
TASK_NAMES: dict[str, str] = {
    "arith": "setdiff_arith",
    "gsm": "setdiff_gsm",
    "gsm8k": "setdiff_gsm8k",
}
"""Pipeline task -> lm-eval task name."""


def register() -> None:
    """Register the ``setdiff`` model type in lm-eval's registry (idempotent, lazy)."""
    import lm_eval.models  # noqa: F401  (lm-eval's own types first: it fills an empty registry)
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target="setdiff.lmeval.model:SetdiffLM")


def task_manager(include_defaults: bool = False, **kwargs: Any) -> Any:
    """An lm-eval `TaskManager` of our tasks (`TASKS_DIR`); with `include_defaults` also of
    lm-eval's own (indexing those takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=include_defaults, **kwargs)


register()
