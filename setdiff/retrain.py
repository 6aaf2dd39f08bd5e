"""Train a paradigm again and score it: the cells of the seed-variance (``setdiff seeds``) and
set-size (``setdiff setsize``) stages.

A `Cell` is one model: the ``train.<task>`` recipe of its paradigm with some fields replaced
(the training seed, the steps), its ``paradigm.<p>`` config with some replaced (the set size),
and its ``decode.<p>`` options. `run` trains it exactly as the train stage does (a diffusion
paradigm from ``models/<task>/ar`` under the paper's recipe, or from the cell's own AR model;
AR from the backbone's initial weights) and decodes the first test prompts greedily, as the
evaluate stage does, recording exact-match accuracy and tokens per forward. Two differences from the
train stage, neither of which changes the weights: no accuracy curve (``train.<task>.curve``
decodes validation prompts between steps through its own generators) and no resumable
checkpoint (a cell is minutes; a killed cell is retrained).

Each finished cell is written at once to ``results/<study>/<task>/<cell>.json`` with the hash
of its inputs (its configs, the decode options, the prompts, and the hashes of the AR model and
of the data); a re-run skips every cell whose hash matches, so a kill loses no finished cell.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from setdiff.artifacts import WEIGHTS_FILE, LoadedModel, save_model_dir
from setdiff.batching import ArraySplit
from setdiff.config import ConfigError, build, to_dict
from setdiff.evaluate import SCORING_BATCH, answer_rows
from setdiff.files import write_json
from setdiff.initial import initial_source, initial_weights, inputs_fingerprint, weights_sha256
from setdiff.layout import TaskFiles
from setdiff.model import ModelConfig
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.preset import Preset
from setdiff.recipe import TaskTrainConfig
from setdiff.sampling.policies import decode_policy
from setdiff.tasks import read_records
from setdiff.tokenizer import Tokenizer, load_tokenizer
from setdiff.train import TrainConfig, train

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Cell:
    """One model: what it is trained and decoded with."""

    name: str
    """Its file name under ``results/<study>/<task>/`` (``setdlm-1``, ``setdlm-d2``)."""
    paradigm: str
    train: TrainConfig
    paradigm_config: Any
    """The paradigm's config record (``paradigm.<p>`` with the cell's replacements)."""
    decode: Mapping[str, Any]
    start: Path | None = None
    """A model directory of this paradigm to fine-tune from instead of `Data.source` (the AR
    model): the main run's model, continued at another set size."""
    source: Path | None = None
    """An AR model directory to fine-tune from instead of `Data.source`: the seed's own AR model
    in the seeds study (a different AR model is part of what varies between machines)."""
    keep: Path | None = None
    """Where the trained model is also saved (a seed's AR model, the start of that seed's
    fine-tunes); a stored row without this directory is recomputed."""
    also_decode: Mapping[str, Any] | None = None
    """Decode options scored too, on the same model (beside `decode`): e.g. the run's headline
    configuration of the paradigm, ``{"verify": True, "window": 8}``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Data:
    """What every cell of a task reads: data, tokenizer, test prompts, starting weights."""

    task: str
    tokenizer: Tokenizer
    tokenizer_path: Path
    train: ArraySplit
    valid: ArraySplit
    records: list[dict[str, Any]]
    net_config: ModelConfig
    source: Path | str | None
    """The starting weights of a fine-tune (`setdiff.initial.initial_source`)."""
    pretrained: str | None = None
    """The starting weights of an AR cell (``model.<task>.pretrained``, or None: random)."""


def make_cell(
    preset: Preset,
    recipe: TaskTrainConfig,
    paradigm: str,
    *,
    name: str,
    where: str,
    train: Mapping[str, Any] | None = None,
    paradigm_config: Mapping[str, Any] | None = None,
    decode: Mapping[str, Any] | None = None,
    start: Path | None = None,
    source: Path | None = None,
    keep: Path | None = None,
    also_decode: Mapping[str, Any] | None = None,
) -> Cell:
    """The recipe, ``paradigm.<p>`` config and ``decode.<p>`` options of `paradigm` with these
    fields replaced; every option checked (one line naming `where`) before any compute."""
    fields = {**to_dict(recipe.for_paradigm(paradigm)), **(train or {})}
    config = build(TrainConfig, fields, f"{preset.path}: {where}")
    if paradigm_config:
        raw = {**to_dict(preset.paradigm(paradigm)), **paradigm_config}
        options = build(PARADIGMS[paradigm][0], raw, f"{preset.path}: {where}: paradigm.{paradigm}")
    else:
        options = preset.paradigm(paradigm)
    decoding = {**preset.decode(paradigm), **(decode or {})}
    extra = None if also_decode is None else {**decoding, **also_decode}
    for label, options_ in (("decode", decoding), ("also_decode", extra)):
        if options_ is None:
            continue
        try:
            decode_policy(make_paradigm(paradigm, options, mask_id=0), dict(options_))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{preset.path}: {where}: {label}.{paradigm}: {err}") from None
    return Cell(name, paradigm, config, options, decoding, start, source, keep, extra)


def load_data(preset: Preset, layout: TaskFiles, recipe: TaskTrainConfig, n_examples: int) -> Data:
    tokenizer = load_tokenizer(layout.tokenizer)
    train_split, valid_split = (ArraySplit.load(layout.encoded(s)) for s in ("train", "valid"))
    model_spec = preset.section(f"model.{layout.task}")
    source = initial_source(
        "setdlm",  # any diffusion paradigm: the rule is the same for all of them
        init_from_ar=recipe.init_from_ar,
        ar_model=layout.model("ar"),
        pretrained=model_spec.pretrained,
    )
    return Data(
        task=layout.task,
        tokenizer=tokenizer,
        tokenizer_path=layout.tokenizer,
        train=train_split,
        valid=valid_split,
        records=read_records(layout.raw / "test.jsonl", layout.task)[:n_examples],
        net_config=model_spec.config(tokenizer.vocab_size, train_split.seq_len),
        source=source,
        pretrained=model_spec.pretrained,
    )


def input_hashes(data: Data) -> dict[str, Any]:
    """sha256 of the starting weights and of the data a cell reads (its results depend on them,
    `setdiff.initial.inputs_fingerprint`), of its test prompts, with the backbone config."""
    hashes: dict[str, Any] = inputs_fingerprint(
        data.train, data.valid, data.tokenizer_path, data.source
    )
    hashes["prompts"] = digest(data.records)
    return {"inputs": hashes, "model": to_dict(data.net_config)}


def cached_run(out_dir: Path, cell: Cell, data: Data, inputs: dict[str, Any]) -> dict[str, Any]:
    """The stored row of `cell` when it was computed for this exact spec, else a fresh one."""
    spec = {
        "train": to_dict(cell.train),
        "paradigm": to_dict(cell.paradigm_config),
        "decode": dict(cell.decode),
        **inputs,
    }
    for key, model_dir in (("start", cell.start), ("source", cell.source)):
        if model_dir is not None:
            spec[key] = weights_sha256(model_dir, f"{model_dir} has no trained model to start from")
    if cell.also_decode is not None:
        spec["also_decode"] = dict(cell.also_decode)
    kept = cell.keep is None or (cell.keep / WEIGHTS_FILE).exists()
    return cached(out_dir / f"{cell.name}.json", spec, lambda: run(cell, data), reuse=kept)


def digest(spec: Any) -> str:
    """The 16-hex-digit hash of a JSON-able spec (a stored row's key)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stored(path: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The row stored at `path` when it was computed for exactly this `spec`, else None."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record["row"] if record.get("spec_hash") == digest(spec) else None


def cached(
    path: Path, spec: dict[str, Any], compute: Callable[[], dict[str, Any]], *, reuse: bool = True
) -> dict:
    """The row stored at `path` when it was computed for this exact `spec` (and `reuse`), else
    `compute()`, written there at once (so a kill loses no finished row). The one result cache
    of the stages that train and score models of their own (seeds, set size, backbone)."""
    row = stored(path, spec) if reuse else None
    if row is not None:
        log.info("%s already done (%s)", path.stem, path)
        return row
    row = compute()
    write_json(path, {"spec_hash": digest(spec), "row": row})
    return row


def run(cell: Cell, data: Data) -> dict[str, Any]:
    """Train one cell from the starting weights and score it on the test prompts."""
    tic = time.perf_counter()
    config = cell.train
    if cell.start is not None:
        start, kind = cell.start, cell.paradigm
    elif cell.paradigm == "ar":
        start, kind = data.pretrained, "ar"
    else:
        start, kind = cell.source or data.source, "ar"
    net = initial_weights(
        data.net_config, config.seed, start, data.task, data.tokenizer_path, paradigm=kind
    )
    paradigm = make_paradigm(
        cell.paradigm,
        cell.paradigm_config,
        mask_id=data.tokenizer.mask_id,
        attention=config.attention,
    )
    result = train(net, paradigm, data.train, data.valid, config)
    net.load_state_dict(result.weights)
    if cell.keep is not None:
        save_model_dir(cell.keep, net, paradigm, tokenizer_file=data.tokenizer_path)
    model = LoadedModel(net=net.eval(), paradigm=paradigm, tokenizer=data.tokenizer, path=Path())
    also = {}
    if cell.also_decode is not None:
        also = {"also": {"decode": dict(cell.also_decode), **score(model, data, cell.also_decode)}}
    row = {
        "paradigm": cell.paradigm,
        "seed": config.seed,
        **score(model, data, cell.decode),
        **also,
        "steps": result.steps,
        "final_eval_loss": result.final_eval_loss,
        "seconds": round(time.perf_counter() - tic, 1),
    }
    log.info("%s: %s", cell.name, row)
    return row


def score(model: LoadedModel, data: Data, decode: Mapping[str, Any]) -> dict[str, Any]:
    """Greedy exact-match accuracy on the test prompts, as the evaluate stage scores them."""
    scored = answer_rows(
        model,
        data.records,
        task=data.task,
        seq_len=data.train.seq_len,
        decode_options=dict(decode),
        show_progress=False,
        batch_size=SCORING_BATCH,
    )
    return {
        "accuracy": sum(r["exact"] for r in scored) / len(scored),
        "n_examples": len(scored),
        "tokens_per_forward": sum(r["new_tokens"] for r in scored)
        / max(1, sum(r["nfe"] for r in scored)),
    }
