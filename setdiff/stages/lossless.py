"""Lossless decoders (setdlm verify) against AR + speculative decoding; metrics/.

DVC stage ``lossless``, at batch 1.

``setdiff lossless --task arith`` reads the ``lossless`` section (`LosslessConfig`). It trains
the draft model (a small AR model on the task's training split, from scratch, kept in
``results/lossless/<task>/draft``: outside ``models/<task>``, which other stages read whole),
then runs `setdiff.bench.lossless.compare` twice on the run's AR and setdlm models: on the
first ``n_select`` validation prompts with every draft size k and window W, which picks the
fastest k (our engine's AR + draft) and the fastest W (setdlm verify); then once on the first
``n_examples`` test prompts at those choices, with transformers' plain, assisted (the draft
exported to HF) and prompt-lookup generate beside them when ``transformers`` is on. Every
method is lossless: its tokens are compared with its reference greedy decode on every prompt
(AR's for the AR methods, setdlm W = 1's for verify).

``metrics/lossless/<task>.json``: the regime, the draft (parameters, held-out loss, seconds),
the validation choice with each candidate's tokens/s, and per test method its accuracy,
tokens/s, tokens per forward, drafts accepted, rows identical to its reference (n/N), and its
speedup over AR and over the fastest AR + speculative method with paired 95% bootstrap CIs.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from setdiff.artifacts import load_model, save_model_dir
from setdiff.batching import ArraySplit
from setdiff.bench.lossless import (
    LosslessConfig,
    Models,
    check_windows,
    compare,
    decoders,
    fastest,
    knob,
)
from setdiff.config import ConfigError
from setdiff.evaluate import score_answer
from setdiff.files import write_json
from setdiff.measure import fingerprint
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.preset import Preset
from setdiff.runtime import setup_torch
from setdiff.stages.common import Layout, start
from setdiff.study import StudyConfig
from setdiff.tasks import read_records
from setdiff.tokenizer import load_tokenizer
from setdiff.train import train

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("lossless",)
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""

SECTION = "lossless"
"""The params section this stage owns (`check_preset` validates it)."""
THREADS = ("lossless.threads", "lossless.draft_train.threads")
"""Params keys of the threads it computes on: the draft's training, then the decoders
(`flows.lanes` gives it the wider as its cores)."""
STUDY = "lossless"
"""``study.lossless``: the tasks this stage runs on (``lossless@<task>``)."""
STUDY_TASKS = "answers"
"""Only tasks with checkable answers."""
STUDY_PARADIGMS = ("ar", "setdlm")
"""It compares the run's AR and setdlm models."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`): ``lossless`` builds (required when
    ``study.lossless`` lists a task), and then every window decodes with verify."""
    if "lossless" in preset or study.tasks_for("lossless"):
        lossless = preset.section("lossless", LosslessConfig)
        if study.tasks_for("lossless"):
            check_windows(lossless, preset.paradigm("setdlm"), str(preset.path))


def main(argv: list[str]) -> None:
    args, preset, layout = start(
        argv, "Lossless decoders against AR with speculative decoding.", answers=True
    )
    config = preset.section("lossless", LosslessConfig)
    check_windows(config, preset.paradigm("setdlm"), str(preset.path))
    for paradigm in ("ar", "setdlm"):
        if not layout.model(paradigm).is_dir():
            raise ConfigError(f"{layout.model(paradigm)}: no model (run the train stage first)")
    setup_torch(threads=config.threads, seed=0)
    draft_dir = Path(args.root) / "results" / "lossless" / args.task / "draft"
    trained = train_draft(config, layout, draft_dir)
    models = load_models(layout, draft_dir, config.transformers)
    tok = models.ar.tokenizer
    valid = read_records(layout.raw / "valid.jsonl", args.task)[: config.n_select]
    test = read_records(layout.raw / "test.jsonl", args.task)[: config.n_examples]
    if len(valid) < config.n_select:
        raise ConfigError(
            f"{preset.path}: lossless.n_select={config.n_select}: the validation split holds "
            f"only {len(valid)} prompts"
        )

    def measure(records: list[dict[str, Any]], ks: tuple[int, ...], ws: tuple[int, ...]) -> dict:
        prompts = [[tok.bos_id] + tok.encode(r["prompt"]) for r in records]

        def score(tokens: list[int], i: int) -> float:
            return float(score_answer(args.task, tok.decode(tokens), records[i])[1] == 1.0)

        chosen, references, speculative = decoders(models, ks, ws)
        with torch.inference_mode():
            return compare(
                chosen,
                references,
                prompts,
                score,
                eos_id=tok.eos_id,
                warmup=prompts[0],
                best_of=speculative,
            )

    log.info("lossless: choosing k and W on %d validation prompts", len(valid))
    select = measure(valid, config.draft_tokens, config.windows)
    k = knob(fastest(select, "ar+draft"))
    w = knob(fastest(select, "setdlm verify"))
    log.info("lossless: k = %d, W = %d; %d test prompts", k, w, len(test))
    figures = measure(test, (k,), (w,))
    write_json(
        Path(args.root) / "metrics" / "lossless" / f"{args.task}.json",
        {
            "task": args.task,
            "regime": {
                "batch_size": 1,
                "threads": config.threads,
                "device": "cpu",
                "parameters": models.ar.net.num_parameters(),
                "n_examples": len(test),
            },
            "draft": {**trained, "parameters": models.draft.net.num_parameters()},
            "selection": {
                "split": "valid",
                "n": len(valid),
                "draft_tokens": k,
                "window": w,
                "tokens_per_second": {n: f["tokens_per_second"] for n, f in select.items()},
            },
            "figures": figures,
            "fingerprint": fingerprint(torch.device("cpu"), params_hash=preset.digest("lossless")),
        },
    )


def train_draft(config: LosslessConfig, layout: Layout, out: Path) -> dict[str, Any]:
    """Train the draft (AR loss, from scratch, `config.draft_train`) and save it to `out`."""
    tokenizer = load_tokenizer(layout.tokenizer)
    train_split, valid_split = (ArraySplit.load(layout.encoded(s)) for s in ("train", "valid"))
    arch = config.draft
    net_config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        n_layer=arch.n_layer,
        n_head=arch.n_head,
        n_kv_head=arch.n_head,
        d_model=arch.d_model,
        d_ff=arch.d_ff,
        max_seq_len=train_split.seq_len,
    )
    torch.manual_seed(config.draft_train.seed)
    net = Transformer(net_config)
    paradigm = make_paradigm("ar", mask_id=tokenizer.mask_id)
    result = train(net, paradigm, train_split, valid_split, config.draft_train)
    save_model_dir(
        out,
        net,
        paradigm,
        tokenizer_file=layout.tokenizer,
        state_dict=result.weights,
        extra={"task": layout.task},
    )
    loss = result.final_eval_loss
    log.info("draft: %d parameters, held-out loss %.4f", net.num_parameters(), loss)
    return {"final_eval_loss": loss, "seconds": round(result.seconds, 1)}


def load_models(layout: Layout, draft_dir: Path, transformers: bool) -> Models:
    """The run's AR and setdlm models, the draft, and (`transformers`) both AR models in HF."""
    task = layout.task
    ar = load_model(layout.model("ar"), paradigm="ar", task=task, tokenizer=layout.tokenizer)
    draft = load_model(draft_dir, paradigm="ar", task=task, tokenizer=layout.tokenizer)
    setdlm = load_model(
        layout.model("setdlm"), paradigm="setdlm", task=task, tokenizer=layout.tokenizer
    )
    if not transformers:
        return Models(ar, draft, setdlm)
    from setdiff.baselines.hf_engine import load_hf_model  # transformers: imported late
    from setdiff.hf import export_hf

    with tempfile.TemporaryDirectory() as tmp:  # loaded into memory, then the files go
        hf_ar = load_hf_model(export_hf(layout.model("ar"), Path(tmp) / "ar"))
        hf_draft = load_hf_model(export_hf(draft_dir, Path(tmp) / "draft"))
    return Models(ar, draft, setdlm, hf_ar, hf_draft)
