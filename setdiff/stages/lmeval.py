"""Answer accuracy through lm-evaluation-harness beside our scorer; metrics/lmeval/.

DVC stage ``lmeval``.

``setdiff lmeval --task arith`` reads ``lmeval`` and ``decode.<paradigm>`` and evaluates the first
``lmeval.n_examples`` test prompts of ``data/<task>/raw/test.jsonl`` with lm-eval's task
``setdiff_<task>`` (its regex extraction and ``exact_match``) for:
- each of ``lmeval.paradigms`` on our engine (the ``setdiff`` lm-eval model type) at the decode
  options the evaluate stage uses (``decode.<paradigm>``, seed ``lmeval.seed``);
- ``vllm``: the AR model exported to Hugging Face format and served by vLLM on 127.0.0.1, through
  lm-eval's own ``local-completions`` client (prompts sent as token ids, BOS first, greedy, [MASK]
  suppressed as our decoder does). When vLLM cannot run it is skipped with the reason
  (``lmeval.vllm.on_unavailable: skip``) or the stage fails (``fail``).
Beside each, the evaluate stage's own decoding and scoring (`setdiff.evaluate.answer_rows`) of the
same prompts (for vLLM: the AR model on our engine), and per-example agreement.

Writes ``metrics/lmeval/<task>/<engine>.json`` (lm-eval's results JSON, per-example samples left
out) and ``metrics/lmeval/<task>/summary.json`` (the side-by-side table the report shows).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from setdiff.config import ConfigError, check
from setdiff.evaluate import answer_rows
from setdiff.files import write_json
from setdiff.lmeval.config import LmevalConfig
from setdiff.preset import Preset
from setdiff.stages.common import Layout, start
from setdiff.study import StudyConfig
from setdiff.tasks import ANSWER_TASKS, read_records

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("lmeval", "decode")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""

METRIC = "exact_match,strict-match"
"""The lm-eval metric key our task YAMLs report."""

SECTION = "lmeval"
"""The params section this stage owns (`check_preset` validates it)."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`) of ``lmeval`` (required by dvc.yaml's
    ``foreach: ${lmeval.tasks}``; ``tasks: []`` = off): its tasks are study tasks with answers,
    its paradigms trained ones."""
    lmeval = preset.section("lmeval", LmevalConfig)
    bad = [t for t in lmeval.tasks if t not in study.tasks or t not in ANSWER_TASKS]
    if bad:
        raise ConfigError(
            f"{preset.path}: lmeval.tasks: {bad} must be study tasks with answers "
            f"({sorted(ANSWER_TASKS)})"
        )
    study.check_trained(lmeval.paradigms, preset.path, "lmeval.paradigms")


def main(argv: list[str]) -> None:
    from setdiff.runtime import setup_torch

    args, preset, layout = start(
        argv, "Answer accuracy through lm-evaluation-harness.", answers=True
    )
    config = preset.section("lmeval", LmevalConfig)
    from setdiff.lmeval.model import SetdiffLM

    models = {  # load and validate every model and decode option before any compute
        p: SetdiffLM(
            path=str(layout.model(p)),
            device=config.device,
            seed=config.seed,
            paradigm=p,
            task=args.task,
            tokenizer=str(layout.tokenizer),
            **preset.section(f"decode.{p}"),
        )
        for p in config.paradigms
    }
    if config.vllm.run and "ar" not in models:
        raise ConfigError("lmeval.vllm.run needs ar in lmeval.paradigms (vLLM serves its export)")
    setup_torch(threads=config.threads or None)
    records = read_records(layout.raw / "test.jsonl", args.task)[: config.n_examples]
    out = layout.root / "metrics" / "lmeval" / args.task
    summary: dict[str, Any] = {"task": args.task, "n_examples": len(records), "engines": {}}
    ours: dict[str, list[dict[str, Any]]] = {}
    for name, lm in models.items():
        ours[name] = answer_rows(
            lm.model,
            records,
            task=args.task,
            seq_len=lm.max_length,
            decode_options={"seed": config.seed, **lm.decode_options},
        )
        results, samples = evaluate(lm, args.task, layout.root, len(records))
        write_json(out / f"{name}.json", portable(results, layout.root))
        summary["engines"][name] = side_by_side(results, samples, ours[name], lm.decode_options)
    if config.vllm.run:
        summary["engines"]["vllm"] = _vllm(config, layout, models["ar"], ours["ar"], len(records))
    write_json(out / "summary.json", summary)
    log.info("%s", {k: v.get("lmeval_accuracy") for k, v in summary["engines"].items()})


VOLATILE = frozenset(
    {"date", "start_time", "end_time", "total_evaluation_time_seconds", "pretty_env_info"}
    | {"git_hash", "upper_git_hash"}
)
"""lm-eval result keys that name this machine or this moment, not the evaluation."""


def portable(value: Any, root: Path) -> Any:
    """lm-eval's results as a metrics file: paths relative to the repository root and no
    clock or machine fields, so the same run writes the same file on any checkout."""
    prefix = str(Path(root).resolve()) + "/"
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(prefix, "")
    return value


def evaluate(
    model: Any, task: str, root: Path, n: int, **kwargs: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """lm-eval's `simple_evaluate` of ``setdiff_<task>`` on the first `n` local test records:
    its results (JSON-safe, without the per-example samples) and the samples by document."""
    import lm_eval

    from setdiff.lmeval import TASK_NAMES, task_manager

    manager = task_manager(metadata={"root": str(root), "limit_records": n})
    results = lm_eval.simple_evaluate(
        model=model,
        tasks=[TASK_NAMES[task]],
        task_manager=manager,
        log_samples=True,
        verbosity="WARNING",
        **kwargs,
    )
    samples = results.pop("samples")[TASK_NAMES[task]]
    return _jsonable(results), sorted(samples, key=lambda s: s["doc_id"])


def side_by_side(
    results: dict[str, Any],
    samples: list[dict[str, Any]],
    ours: list[dict[str, Any]],
    options: dict[str, Any],
) -> dict[str, Any]:
    """lm-eval's accuracy beside the evaluate stage's on the same prompts, with per-example
    agreement of the decoded texts and of the verdicts."""
    task = next(iter(results["results"]))
    texts = [s["resps"][0][0] for s in samples]
    lm_exact = [float(s["exact_match"]) for s in samples]
    check(len(texts) == len(ours), f"lm-eval scored {len(texts)} prompts, ours {len(ours)}")
    return {
        "status": "ran",
        "decode_options": options,
        "lmeval_accuracy": float(results["results"][task][METRIC]),
        "setdiff_accuracy": sum(r["exact"] for r in ours) / len(ours),
        "n": len(ours),
        "same_text": sum(t == r["text"] for t, r in zip(texts, ours, strict=True)),
        "same_verdict": sum(e == r["exact"] for e, r in zip(lm_exact, ours, strict=True)),
        "disagreements": [
            {"index": i, "lmeval": t, "setdiff": r["text"], "verdicts": [e, r["exact"]]}
            for i, (t, e, r) in enumerate(zip(texts, lm_exact, ours, strict=True))
            if e != r["exact"]
        ][:10],
    }


def _vllm(
    config: LmevalConfig, layout: Layout, ar: Any, ours: list[dict[str, Any]], n: int
) -> dict[str, Any]:
    """The AR export behind vLLM, through lm-eval's ``local-completions``; compared with the AR
    model on our engine. A skipped run says why."""
    from setdiff.baselines.vllm_server import VLLMServer

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="setdiff-lmeval-")))
        hf_dir, client_dir = _export(layout.model("ar"), tmp)
        seq_len = ar.max_length
        try:
            server = stack.enter_context(
                VLLMServer(
                    hf_dir,
                    max_model_len=seq_len,
                    startup_timeout_s=config.vllm.startup_timeout_s,
                    served_model_name="ar",
                )
            )
        except (OSError, RuntimeError, ValueError) as err:
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:500]
            if config.vllm.on_unavailable == "fail":
                raise RuntimeError(
                    f"vLLM is unavailable ({reason}); install it (make vllm-env) or "
                    "set lmeval.vllm.on_unavailable: skip"
                ) from err
            log.warning("vLLM skipped: %s", reason)
            return {"status": "skipped", "reason": reason}
        longest = max(r["prompt_tokens"] for r in ours)
        results, samples = evaluate(
            "local-completions",
            layout.task,
            layout.root,
            n,
            model_args=client_args(server.base_url, client_dir, seq_len, config.vllm.timeout_s),
            gen_kwargs={
                "max_gen_toks": seq_len - longest,
                "logit_bias": {str(ar.tok.mask_id): -100},
            },
        )
    write_json(
        layout.root / "metrics" / "lmeval" / layout.task / "vllm.json",
        portable(results, layout.root),
    )
    row = side_by_side(results, samples, ours, {})
    return {**row, "engine": "vLLM through lm-eval's local-completions", "compared_with": "ar"}


def client_args(base_url: str, tokenizer_dir: Path, seq_len: int, timeout_s: int) -> dict:
    """lm-eval ``local-completions`` model args: token-id prompts (BOS first, as our models were
    trained), the server's context as lm-eval's ``max_length`` (it keeps one slot back)."""
    return {
        "model": "ar",
        "base_url": f"{base_url}/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": str(tokenizer_dir),
        "tokenized_requests": True,
        "add_bos_token": True,
        "max_length": seq_len + 1,
        "num_concurrent": 1,
        "timeout": timeout_s,
    }


def _export(model_dir: Path, tmp: Path) -> tuple[Path, Path]:
    """The HF export of the AR model (served by vLLM) and a client tokenizer for lm-eval: the
    same vocabulary with BOS added on encode (our tokenizer adds no special tokens)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from setdiff.hf import export_hf
    from setdiff.tokenizer import load_tokenizer

    hf_dir = export_hf(model_dir, tmp / "ar-hf")
    client = tmp / "client-tokenizer"
    shutil.copytree(hf_dir, client, ignore=shutil.ignore_patterns("*.safetensors"))
    ours = load_tokenizer(model_dir / "tokenizer.json")
    bos = ours.special["bos_token"]
    backend = Tokenizer.from_file(str(client / "tokenizer.json"))
    backend.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, ours.bos_id)]
    )
    backend.save(str(client / "tokenizer.json"))
    return hf_dir, client


def _jsonable(value: Any) -> Any:
    """lm-eval's results with NumPy scalars and other objects made JSON-safe."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)
