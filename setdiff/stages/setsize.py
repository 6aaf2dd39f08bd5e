"""Set size: setdlm/bd3lm fine-tuned at other set sizes D, accuracy; metrics/.

DVC stage ``setsize``: set diffusion's accuracy at other set sizes D than the main run's.

``setdiff setsize --task arith`` reads the ``setsize`` section (paradigms, set sizes, start,
steps, lr, decode_main, test prompts), ``train.<task>``, ``paradigm.<p>``, ``decode.<p>`` and
``model.<task>``. For every (paradigm, D) cell it fine-tunes that paradigm exactly as the train
stage does, with only its set size replaced (setdlm's ``set_size``, decoded at window W = D as
the paper pairs them; bd3lm's ``block_size``) and ``steps`` / ``lr`` when given, starting from
the task's AR model (``start: ar``, the paper's recipe) or from the main run's model of the
paradigm (``start: main``, continued at D); then it decodes the first ``n_examples`` test
prompts greedily with ``decode.<p>``, recording exact-match accuracy. With ``decode_main`` it
also decodes the main run's setdlm at W = D without training, which separates what the window
gives from what training at D adds.

Cells are trained, scored and kept as `setdiff.retrain` does
(``results/setsize/<task>/<paradigm>-d<D>.json``; a re-run skips every finished cell whose
inputs are unchanged). ``metrics/setsize/<task>.json`` lists one row per cell and, under
``main``, each paradigm's own D and W in the main run; the report joins the main run's
accuracies (``metrics/evaluate/<task>/{ar,<p>}.json``) for the gap to AR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from setdiff import retrain
from setdiff.artifacts import load_model
from setdiff.files import write_json
from setdiff.initial import weights_sha256
from setdiff.preset import Preset
from setdiff.recipe import SET_SIZE_KEYS, SetSizeStudyConfig, TaskTrainConfig
from setdiff.stages.common import Layout, start
from setdiff.study import StudyConfig

PARAMS: tuple[str, ...] = ("setsize", "train.{task}", "paradigm", "decode", "model.{task}")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

SECTION = "setsize"
"""The params section this stage owns (`check_preset` validates it)."""
THREADS = ("setsize.threads",)
"""The params key of the threads it computes on (`flows.lanes` gives it as many cores)."""
STUDY = "setsize"
"""``study.setsize``: the tasks this stage runs on (``setsize@<task>``)."""
STUDY_TASKS = "answers"
"""Only tasks with checkable answers."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`): ``setsize`` builds (required when
    ``study.setsize`` lists a task) and trains only paradigms the study trains."""
    if "setsize" in preset or study.tasks_for("setsize"):
        setsize = preset.section("setsize", SetSizeStudyConfig)
        study.check_trained(setsize.paradigms, preset.path, "setsize.paradigms")


def main(argv: list[str]) -> None:
    args, preset, layout = start(argv, "Set size: diffusion accuracy per set size D.", answers=True)
    study = preset.section("setsize", SetSizeStudyConfig)
    recipe: TaskTrainConfig = preset.section(f"train.{args.task}", TaskTrainConfig)
    cells = [
        _cell(preset, recipe, study, p, d, args.task, args.root)
        for p in study.paradigms
        for d in study.set_sizes
    ]
    data = retrain.load_data(preset, layout, recipe, study.n_examples)
    inputs = retrain.input_hashes(data)
    out_dir = Path(args.root) / "results" / "setsize" / args.task
    main_runs = {
        p: {
            "set_size": getattr(preset.paradigm(p), SET_SIZE_KEYS[p]),
            "window": preset.decode(p).get("window") if p == "setdlm" else None,
        }
        for p in study.paradigms
    }
    rows = []
    for cell in cells:
        row = retrain.cached_run(out_dir, cell, data, inputs)
        size = getattr(cell.paradigm_config, SET_SIZE_KEYS[cell.paradigm])
        model = "fine-tuned from AR" if study.start == "ar" else "main run's model, fine-tuned on"
        rows.append({**row, "set_size": size, "window": cell.decode.get("window"), "model": model})
        if cell.paradigm == "setdlm" and study.decode_main:
            main_size = main_runs["setdlm"]["set_size"]
            rows.append(
                {**_decode_main(layout, data, inputs, cell, out_dir), "set_size": main_size}
            )
    summary = {
        "task": args.task,
        "n_examples": len(data.records),
        "start": study.start,
        "main": main_runs,
        "rows": rows,
    }
    write_json(Path(args.root) / "metrics" / "setsize" / f"{args.task}.json", summary)


def _decode_main(
    layout: Layout, data: retrain.Data, inputs: dict[str, Any], cell: retrain.Cell, out_dir: Path
) -> dict[str, Any]:
    """The main run's model of `cell`'s paradigm decoded with `cell`'s options (W = D)."""
    path = layout.model(cell.paradigm)
    missing = f"{path} has no trained {cell.paradigm} model (run the train stage first)"
    spec = {"decode": dict(cell.decode), "main": weights_sha256(path, missing), **inputs}

    def compute() -> dict[str, Any]:
        model = load_model(
            path, paradigm=cell.paradigm, task=data.task, tokenizer=data.tokenizer_path
        )
        return {"paradigm": cell.paradigm, **retrain.score(model, data, cell.decode)}

    row = retrain.cached(out_dir / f"{cell.name}-main.json", spec, compute)
    return {**row, "window": cell.decode.get("window"), "model": "main run's model, decoded only"}


def _cell(
    preset: Preset,
    recipe: TaskTrainConfig,
    study: SetSizeStudyConfig,
    paradigm: str,
    size: int,
    task: str,
    root: str,
) -> retrain.Cell:
    """`paradigm` at set size `size` (setdlm decoded at window W = D); options checked first."""
    decode: dict[str, Any] = {"window": size} if paradigm == "setdlm" else {}
    return retrain.make_cell(
        preset,
        recipe,
        paradigm,
        name=f"{paradigm}-d{size}",
        where=f"setsize (train.{task}, {paradigm}, D = {size})",
        paradigm_config={SET_SIZE_KEYS[paradigm]: size},
        decode=decode,
        train={
            **({} if study.steps is None else {"steps": study.steps}),
            **({} if study.lr is None else {"lr": study.lr}),
            **({} if study.threads is None else {"threads": study.threads}),
        },
        start=Layout(root, task).model(paradigm) if study.start == "main" else None,
    )
