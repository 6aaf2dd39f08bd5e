"""Backbone study: AR and setdlm accuracy per backbone variant; metrics/.

DVC stage ``backbone``: which backbone makes AR -> set-diffusion adaptation work.

``setdiff backbone --task arith`` reads ``model.<task>`` (the base shape) and the ``backbone``
section: named variants (overrides of the base shape, plus ``ar_context_loss``), the set sizes D
and one training recipe each for AR and the fine-tunes. For every variant it trains AR from
scratch, fine-tunes setdlm at each D from that AR (the paper's recipe), and decodes
``n_examples`` test prompts greedily (AR; setdlm at W = D and at W = 1, threshold off).

A variant may also override the fine-tune's recipe (``diffusion: {lr: 0.001, steps: 1600}``,
any `TrainConfig` field): the recipe axis of the same question. Variants with the same backbone,
AR loss and AR budget share one AR model, trained once and kept in
``results/backbone/<task>/ar/<hash>.safetensors``.

``--only a,b`` runs just those variants (to share the study between processes by hand); the
table always lists every variant of the config: stored ones, and the rest as not run yet.

Each finished variant is written to ``results/backbone/<task>/<variant>.json`` at once; a re-run
skips variants whose record matches the current config, so a kill loses no finished variant.
The table (``metrics/backbone/<task>.json``) lands in the report.

Every variant is trained with the same seed, data order and budget, so rows differ only in the
backbone; one seed per variant (compare differences against the binomial standard error that
the table prints).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from setdiff.artifacts import LoadedModel
from setdiff.batching import ArraySplit
from setdiff.config import ConfigError, build, to_dict
from setdiff.evaluate import answer_rows
from setdiff.files import write_json
from setdiff.initial import inputs_fingerprint
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import ARConfig, SetDLMConfig, make_paradigm
from setdiff.preset import Preset
from setdiff.recipe import BackboneStudyConfig
from setdiff.retrain import cached, digest, stored
from setdiff.stages.common import start
from setdiff.study import StudyConfig
from setdiff.tasks import read_records
from setdiff.tokenizer import Tokenizer, load_tokenizer
from setdiff.train import TrainConfig, train

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("model.{task}", "backbone")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

SECTION = "backbone"
"""The params section this stage owns (`check_preset` validates it)."""
STUDY = "backbone"
"""``study.backbone``: the tasks this stage runs on (``backbone@<task>``)."""
STUDY_TASKS = "answers"
"""Only tasks with checkable answers."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`): ``backbone`` builds (required when
    ``study.backbone`` lists a task)."""
    if "backbone" in preset or study.tasks_for("backbone"):
        preset.section("backbone", BackboneStudyConfig)


def main(argv: list[str]) -> None:
    only, argv = _only(argv)
    args, preset, layout = start(
        argv, "Backbone study: AR and setdlm accuracy per variant.", answers=True
    )
    study = preset.section("backbone", BackboneStudyConfig)
    tokenizer = load_tokenizer(layout.tokenizer)
    train_split, valid_split = (ArraySplit.load(layout.encoded(s)) for s in ("train", "valid"))
    base = preset.section(f"model.{args.task}").config(tokenizer.vocab_size, train_split.seq_len)
    where = f"{preset.path}: backbone.variants"
    variants = {n: _variant(base, study, v, f"{where}.{n}") for n, v in study.variants.items()}
    unknown = sorted(set(only or ()) - set(variants))
    if unknown:
        raise ConfigError(f"--only: unknown variant(s) {unknown}; {where} has {list(variants)}")
    records = read_records(layout.raw / "test.jsonl", args.task)[: study.n_examples]
    data = _Data(args.task, tokenizer, train_split, valid_split, records)
    budget = {k: v for k, v in to_dict(study).items() if k != "variants"}
    # What the AR models also depend on (data, tokenizer), and every row (and test prompts).
    fingerprint = inputs_fingerprint(train_split, valid_split, layout.tokenizer, None)
    inputs = {**fingerprint, "prompts": digest({"records": records})}
    out_dir = Path(args.root) / "results" / "backbone" / args.task
    specs = {
        name: {**variant.spec, "budget": budget, "inputs": inputs}
        for name, variant in variants.items()
    }
    ar_models = _ARStore(out_dir / "ar", study.ar, data, fingerprint)
    for name, variant in variants.items():
        if only is None or name in only:
            cached(
                out_dir / f"{name}.json",
                specs[name],
                lambda n=name, v=variant: _run_variant(n, v, study, data, ar_models),
            )
    # The table: every variant of the config, from the store (a share run with --only leaves
    # the others as "not run yet").
    rows = [
        stored(out_dir / f"{name}.json", spec) or _not_run(name) for name, spec in specs.items()
    ]
    summary = {"task": args.task, "n_examples": len(records), **budget, "rows": rows}
    write_json(Path(args.root) / "metrics" / "backbone" / f"{args.task}.json", summary)


def _only(argv: list[str]) -> tuple[list[str] | None, list[str]]:
    """``--only a,b``: run just these variants (to share a study between processes by hand);
    the table lists every variant, the others from the store or as not run yet."""
    if "--only" not in argv:
        return None, argv
    i = argv.index("--only")
    if i + 1 >= len(argv):
        raise ConfigError("--only: expected a comma-separated list of variant names")
    return argv[i + 1].split(","), argv[:i] + argv[i + 2 :]


@dataclasses.dataclass(frozen=True, slots=True)
class _Variant:
    model: ModelConfig
    context_loss: bool
    diffusion: TrainConfig
    """The study's fine-tune recipe with the variant's ``diffusion`` overrides."""
    recipe: Mapping[str, Any]
    """The overrides alone (recorded in the row)."""

    @property
    def spec(self) -> dict[str, Any]:
        """What the stored row depends on besides the study's budget. A variant without recipe
        overrides keeps the spec (and so the stored row) it had before the recipe axis."""
        spec = {"model": to_dict(self.model), "ar_context_loss": self.context_loss}
        return {**spec, "diffusion": dict(self.recipe)} if self.recipe else spec


def _variant(
    base: ModelConfig, study: BackboneStudyConfig, overrides: Mapping[str, Any], where: str
) -> _Variant:
    fields = dict(overrides)
    context_loss = fields.pop("ar_context_loss", False)
    if not isinstance(context_loss, bool):
        raise ConfigError(f"{where}.ar_context_loss: expected true/false, got {context_loss!r}")
    recipe = fields.pop("diffusion", None) or {}
    if not isinstance(recipe, Mapping):
        raise ConfigError(f"{where}.diffusion: expected training fields, got {recipe!r}")
    diffusion = build(TrainConfig, {**to_dict(study.diffusion), **recipe}, f"{where}.diffusion")
    model = build(ModelConfig, {**to_dict(base), **fields}, where)
    return _Variant(model, context_loss, diffusion, dict(recipe))


def _not_run(name: str) -> dict[str, Any]:
    return {"variant": name, "missing": "not run yet (setdiff backbone computes it)"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Data:
    task: str
    tokenizer: Tokenizer
    train: ArraySplit
    valid: ArraySplit
    records: list[dict[str, Any]]


class _ARStore:
    """AR models of the study, one per (backbone, AR loss): trained once, then read back."""

    def __init__(
        self, directory: Path, config: TrainConfig, data: _Data, inputs: dict[str, Any]
    ) -> None:
        self.directory, self.config, self.data, self.inputs = directory, config, data, inputs

    def weights(self, variant: _Variant) -> dict[str, torch.Tensor]:
        key = {
            "model": to_dict(variant.model),
            "ar_context_loss": variant.context_loss,
            "ar": to_dict(self.config),
            "inputs": self.inputs,
        }
        path = self.directory / f"{digest(key)}.safetensors"
        if path.exists():
            log.info("backbone: AR model %s already trained (%s)", path.stem, path)
            return load_file(str(path))
        torch.manual_seed(self.config.seed)
        ar = make_paradigm("ar", ARConfig(context_loss=variant.context_loss), mask_id=self.mask_id)
        net = Transformer(variant.model)
        weights = train(net, ar, self.data.train, self.data.valid, self.config).weights
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        save_file({k: v.contiguous() for k, v in weights.items()}, str(partial))
        partial.replace(path)
        return weights

    @property
    def mask_id(self) -> int:
        return self.data.tokenizer.mask_id


def _run_variant(
    name: str, variant: _Variant, study: BackboneStudyConfig, data: _Data, ar_models: _ARStore
) -> dict[str, Any]:
    tic = time.perf_counter()
    ar_weights = ar_models.weights(variant)
    net = Transformer(variant.model)
    net.load_state_dict(ar_weights)
    mask_id = data.tokenizer.mask_id
    ar = make_paradigm("ar", ARConfig(context_loss=variant.context_loss), mask_id=mask_id)
    row: dict[str, Any] = {
        "variant": name,
        "parameters": net.num_parameters(),
        "ar_context_loss": variant.context_loss,
        "model": to_dict(variant.model),
        "diffusion": dict(variant.recipe),
        "ar": _accuracy(net, ar, data, {}),
    }
    for d in study.set_sizes:
        net.load_state_dict(ar_weights)
        setdlm = make_paradigm("setdlm", SetDLMConfig(set_size=d), mask_id=mask_id)
        tuned = train(net, setdlm, data.train, data.valid, variant.diffusion)
        net.load_state_dict(tuned.weights)
        row[f"setdlm_d{d}"] = _accuracy(net, setdlm, data, {"window": d})
        row[f"setdlm_d{d}_w1"] = _accuracy(net, setdlm, data, {"window": 1})
        row[f"setdlm_d{d}_eval_loss"] = tuned.final_eval_loss
    row["seconds"] = round(time.perf_counter() - tic, 1)
    log.info("backbone %s: %s", name, {k: v for k, v in row.items() if k != "model"})
    return row


def _accuracy(net: Transformer, paradigm: Any, data: _Data, options: dict) -> float:
    """Greedy exact-match accuracy on the study's test prompts."""
    model = LoadedModel(net=net.eval(), paradigm=paradigm, tokenizer=data.tokenizer, path=Path())
    rows = answer_rows(
        model,
        data.records,
        task=data.task,
        seq_len=net.config.max_seq_len,
        decode_options=options,
        show_progress=False,
    )
    net.train()
    return sum(r["exact"] for r in rows) / len(rows)
