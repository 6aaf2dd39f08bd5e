"""DVC stage ``seeds``: the seed variance of the diffusion paradigms' accuracy, measured.

``setdiff seeds --task arith`` reads the ``seeds`` section (paradigms, training seeds, steps,
test prompts), ``train.<task>``, ``paradigm.<p>``, ``decode.<p>`` and ``model.<task>``. For every
(paradigm, seed) cell it trains that paradigm exactly as the train stage does (same starting
weights, ``models/<task>/ar`` under the paper's recipe, same ``train.<task>`` recipe for the
paradigm with only ``seed``, and ``steps`` when given, replaced; same ``paradigm.<p>``) and
decodes the first ``n_examples`` test prompts greedily with ``decode.<p>``, as the evaluate stage
does, recording exact-match accuracy.

What a training seed varies: `TrainConfig.seed` seeds the global torch RNG before the weights are
built (`setdiff.initial.initial_weights`; it draws nothing when they are the AR model's) and the
training generator, which draws every batch (the data order) and the paradigm's training noise
(orders, masked positions, times); the held-out loss uses ``seed + 1``. The data, the AR model and
the test prompts stay fixed, so the spread is training variance alone. The decode's own sampler
seed stays at its default (greedy decoding draws nothing).

Two differences from the train stage, neither of which changes the weights: no accuracy curve
(``train.<task>.curve`` decodes validation prompts between steps through its own generators) and
no resumable checkpoint (a cell is minutes; a killed cell is retrained).

Each finished cell is written at once to ``results/seeds/<task>/<paradigm>-<seed>.json`` with
the hash of its inputs (its configs, the decode options, the prompts, and the hashes of the AR
model and of the data); a re-run skips every cell whose hash matches, so a kill loses no finished
cell. ``metrics/seeds/<task>.json`` holds, per paradigm, the seeds and their accuracies, mean,
sample standard deviation, and the binomial standard error of one run's accuracy at
``n_examples`` prompts (what the report's bootstrap CIs measure) for comparison. The main run's
accuracy (the recipe's seed, ``metrics/evaluate/<task>/<p>.json``) is joined by the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

from setdiff.artifacts import LoadedModel, sha256_bytes, write_json
from setdiff.batching import ArraySplit
from setdiff.config import ConfigError, build, to_dict
from setdiff.evaluate import answer_rows
from setdiff.initial import initial_source, initial_weights
from setdiff.model import ModelConfig
from setdiff.paradigm import make_paradigm
from setdiff.preset import Preset, load_preset
from setdiff.recipe import SeedStudyConfig, TaskTrainConfig
from setdiff.stages.common import Layout, parse_args, setup_logging
from setdiff.tasks import ANSWER_TASKS, read_records
from setdiff.tokenizer import Tokenizer, load_tokenizer
from setdiff.train import TrainConfig, train

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _Cell:
    """One (paradigm, seed) model: what it is trained and decoded with."""

    paradigm: str
    seed: int
    train: TrainConfig
    paradigm_config: Any
    decode: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.paradigm}-{self.seed}"


@dataclasses.dataclass(frozen=True, slots=True)
class _Data:
    task: str
    tokenizer: Tokenizer
    tokenizer_path: Path
    train: ArraySplit
    valid: ArraySplit
    records: list[dict[str, Any]]
    net_config: ModelConfig
    source: Path | str | None
    """The starting weights (`setdiff.initial.initial_source`)."""


def main(argv: list[str]) -> None:
    args = parse_args(argv, "Seed variance: diffusion accuracy per training seed.", paradigm=False)
    setup_logging()
    preset = load_preset(args.params)
    study = preset.section("seeds", SeedStudyConfig)
    if args.task not in ANSWER_TASKS:
        raise ConfigError(
            f"--task: {args.task!r} has no answers to score; use {sorted(ANSWER_TASKS)}"
        )
    recipe: TaskTrainConfig = preset.section(f"train.{args.task}", TaskTrainConfig)
    cells = [
        _cell(preset, recipe, study, p, s, args.task) for p in study.paradigms for s in study.seeds
    ]
    layout = Layout(args.root, args.task)
    data = _data(preset, layout, recipe, study.n_examples)
    inputs = {"inputs": _input_hashes(layout, data), "model": to_dict(data.net_config)}
    out_dir = Path(args.root) / "results" / "seeds" / args.task
    rows = [
        _cached(out_dir / f"{cell.name}.json", _spec(cell, inputs), lambda c=cell: _run(c, data))
        for cell in cells
    ]
    summary = {
        "task": args.task,
        "n_examples": len(data.records),
        "steps": study.steps,
        "paradigms": {
            name: _summary(
                [r for r in rows if r["paradigm"] == name],
                len(data.records),
                recipe.for_paradigm(name),
            )
            for name in study.paradigms
        },
    }
    write_json(Path(args.root) / "metrics" / "seeds" / f"{args.task}.json", summary)


def _cell(
    preset: Preset,
    recipe: TaskTrainConfig,
    study: SeedStudyConfig,
    paradigm: str,
    seed: int,
    task: str,
) -> _Cell:
    """The recipe of `paradigm` with this seed (and the study's steps); its options checked
    before any compute."""
    fields = {**to_dict(recipe.for_paradigm(paradigm)), "seed": seed}
    if study.steps is not None:
        fields["steps"] = study.steps
    config = build(TrainConfig, fields, f"{preset.path}: seeds (train.{task}, {paradigm})")
    paradigm_config = preset.section(f"paradigm.{paradigm}")
    decode = preset.section(f"decode.{paradigm}")
    try:
        make_paradigm(paradigm, paradigm_config, mask_id=0).decode_policy(dict(decode))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{preset.path}: decode.{paradigm}: {err}") from None
    return _Cell(paradigm, seed, config, paradigm_config, decode)


def _data(preset: Preset, layout: Layout, recipe: TaskTrainConfig, n_examples: int) -> _Data:
    tokenizer = load_tokenizer(layout.tokenizer)
    train_split, valid_split = (ArraySplit.load(layout.encoded(s)) for s in ("train", "valid"))
    model_spec = preset.section(f"model.{layout.task}")
    source = initial_source(
        "setdlm",  # any diffusion paradigm: the rule is the same for all of them
        init_from_ar=recipe.init_from_ar,
        ar_model=layout.model("ar"),
        pretrained=model_spec.pretrained,
    )
    return _Data(
        task=layout.task,
        tokenizer=tokenizer,
        tokenizer_path=layout.tokenizer,
        train=train_split,
        valid=valid_split,
        records=read_records(layout.raw / "test.jsonl", layout.task)[:n_examples],
        net_config=model_spec.config(tokenizer.vocab_size, train_split.seq_len),
        source=source,
    )


def _input_hashes(layout: Layout, data: _Data) -> dict[str, Any]:
    """sha256 of the starting weights and of the data a cell reads (its results depend on them)."""
    files = {
        "train": layout.encoded("train"),
        "valid": layout.encoded("valid"),
        "tokenizer": layout.tokenizer,
    }
    hashes: dict[str, Any] = {k: sha256_bytes(p.read_bytes()) for k, p in files.items()}
    hashes["prompts"] = _digest(data.records)
    if isinstance(data.source, Path):
        weights = data.source / "model.safetensors"
        if not weights.exists():
            raise ConfigError(
                f"train.{data.task}.init_from_ar is true but {data.source} has no trained AR model"
            )
        hashes["init"] = sha256_bytes(weights.read_bytes())
    else:
        hashes["init"] = data.source  # a pretrained id, or None (random weights)
    return hashes


def _spec(cell: _Cell, inputs: dict[str, Any]) -> dict[str, Any]:
    return {
        "train": to_dict(cell.train),
        "paradigm": to_dict(cell.paradigm_config),
        "decode": cell.decode,
        **inputs,
    }


def _digest(spec: Any) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cached(path: Path, spec: dict[str, Any], run: Any) -> dict[str, Any]:
    """The stored row when it was computed for this exact spec, else a fresh one (saved)."""
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("spec_hash") == _digest(spec):
            log.info("seeds: %s already done (%s)", path.stem, path)
            return stored["row"]
    row = run()
    write_json(path, {"spec_hash": _digest(spec), "row": row})
    return row


def _run(cell: _Cell, data: _Data) -> dict[str, Any]:
    """Train one cell from the starting weights and score it on the test prompts."""
    tic = time.perf_counter()
    config = cell.train
    net = initial_weights(data.net_config, config.seed, data.source, data.task, data.tokenizer_path)
    mask_id = data.tokenizer.mask_id
    paradigm = make_paradigm(
        cell.paradigm, cell.paradigm_config, mask_id=mask_id, attention=config.attention
    )
    result = train(net, paradigm, data.train, data.valid, config)
    net.load_state_dict(result.weights)
    model = LoadedModel(net=net.eval(), paradigm=paradigm, tokenizer=data.tokenizer, path=Path())
    scored = answer_rows(
        model,
        data.records,
        task=data.task,
        seq_len=data.train.seq_len,
        decode_options=cell.decode,
        show_progress=False,
    )
    row = {
        "paradigm": cell.paradigm,
        "seed": cell.seed,
        "accuracy": sum(r["exact"] for r in scored) / len(scored),
        "n_examples": len(scored),
        "steps": result.steps,
        "final_eval_loss": result.final_eval_loss,
        "seconds": round(time.perf_counter() - tic, 1),
    }
    log.info("seeds %s: %s", cell.name, row)
    return row


def _summary(rows: list[dict[str, Any]], n_examples: int, recipe: TrainConfig) -> dict[str, Any]:
    """Mean and sample standard deviation over seeds, beside one run's binomial standard error."""
    accuracies = [float(r["accuracy"]) for r in rows]
    mean = statistics.fmean(accuracies)
    return {
        "seeds": [r["seed"] for r in rows],
        "accuracies": accuracies,
        "n": len(accuracies),
        "mean": mean,
        "sd": statistics.stdev(accuracies) if len(accuracies) > 1 else None,
        "binomial_se": math.sqrt(mean * (1 - mean) / n_examples),
        "steps": rows[0]["steps"],
        "recipe_seed": recipe.seed,
        "recipe_steps": recipe.steps,
    }
