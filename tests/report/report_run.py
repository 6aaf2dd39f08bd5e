"""A synthetic run for the report tests: small but realistic CSV/JSON/JSONL artifacts written by
`write_run`, standing in for the pipeline, so no report test trains or decodes."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from metrics_records import AGAINST_BEST_AR, BATCHED, LOSSLESS
from PIL import Image

from reports.analysis import stats

REPO = Path(__file__).resolve().parents[2]


PARADIGMS = ("ar", "mdlm", "setdlm")


CONFIGS = {
    "ar": [("default", None, None, 0.80, 1.0)],
    "mdlm": [("threshold=off", None, None, 0.55, 1.0), ("threshold=0.9", None, 0.9, 0.50, 1.8)],
    "setdlm": [
        ("threshold=off window=4", 4, None, 0.75, 1.0),
        ("threshold=0.9 window=4", 4, 0.9, 0.70, 2.2),
        ("threshold=off window=8", 8, None, 0.72, 1.0),
        ("threshold=0.9 window=8", 8, 0.9, 0.60, 3.0),
    ],
}


"""paradigm -> (config, window, threshold, accuracy, tokens per forward)."""


N_EXAMPLES, PROMPT, ANSWER = 20, 10, 12


THROUGHPUT = {"4": 2500.0, "8": 4000.0}


"""vLLM's measured aggregate tokens/s per concurrency (results/baseline/<task>.json)."""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _json(path: Path, data: object) -> None:
    _write(path, json.dumps(data, indent=1))


def _steps(paradigm: str, per_forward: float, rng: np.random.Generator) -> list[list[int]]:
    positions = list(range(PROMPT, PROMPT + ANSWER))
    if paradigm == "ar":
        return [[p] for p in positions]
    if paradigm == "mdlm":
        rng.shuffle(positions)
    steps = []
    while positions:
        k = max(1, min(len(positions), int(rng.poisson(per_forward - 1)) + 1))
        head = positions[: min(len(positions), 4)]
        chosen = sorted(rng.choice(head, size=min(k, len(head)), replace=False).tolist())
        steps.append(chosen)
        positions = [p for p in positions if p not in chosen]
    return steps


def _bench(task: str, rng: np.random.Generator, speed: float) -> tuple[list[dict], list[dict]]:
    rows, traces = [], []
    for paradigm in PARADIGMS:
        for config, window, threshold, accuracy, per_forward in CONFIGS[paradigm]:
            for example in range(N_EXAMPLES):
                steps = _steps(paradigm, per_forward, rng)
                latency = speed * len(steps) * 0.002 * (1 + 0.1 * rng.random())
                rows.append(
                    {
                        "task": task,
                        "paradigm": paradigm,
                        "engine": "setdiff",
                        "config": config,
                        "window": window,
                        "threshold": threshold,
                        "regime": "latency",
                        "concurrency": 1,
                        "example": example,
                        "prompt_tokens": PROMPT,
                        "new_tokens": ANSWER,
                        "nfe": len(steps),
                        "latency_s": latency,
                        "forward_s": latency * 0.9,
                        "peak_mem_mb": 300 + 10 * per_forward,
                        "kv_cache_mb": 0.02,
                        "score": float(rng.random() < accuracy),
                        "exact": float(rng.random() < accuracy),
                        "stopped": True,
                        "tokens_per_forward": ANSWER / len(steps),
                        "tokens_per_second": ANSWER / latency,
                    }
                )
                traces.append(
                    {
                        "paradigm": paradigm,
                        "config": config,
                        "example": example,
                        "prompt_tokens": PROMPT,
                        "steps": steps,
                    }
                )
    return rows, traces


def _baseline(task: str, rng: np.random.Generator) -> list[dict]:
    rows = []
    for engine, regime, concurrency, latency in [
        ("setdiff", "latency", 1, 0.02),
        ("vllm", "latency", 1, 0.004),
        ("transformers", "latency", 1, 0.03),
        ("vllm", "throughput", 4, 0.01),
        ("vllm", "throughput", 8, 0.02),
    ]:
        config = "greedy" if regime == "latency" else f"greedy concurrency={concurrency}"
        for example in range(N_EXAMPLES):
            rows.append(
                {
                    "task": task,
                    "paradigm": "ar",
                    "engine": engine,
                    "config": config,
                    "window": None,
                    "threshold": None,
                    "regime": regime,
                    "concurrency": concurrency,
                    "example": example,
                    "prompt_tokens": PROMPT,
                    "new_tokens": ANSWER,
                    "nfe": ANSWER,
                    "latency_s": latency,
                    "forward_s": None,
                    "peak_mem_mb": 900.0,
                    "kv_cache_mb": None,
                    "score": 1.0,
                    "exact": float(rng.random() < 0.8),
                    "stopped": True,
                    "tokens_per_forward": 1.0,
                    "tokens_per_second": ANSWER / latency,
                }
            )
    return rows


def _point(config: str, accuracy: float, rate: float) -> dict:
    return {
        "config": config,
        "engine": "setdiff",
        "accuracy": accuracy,
        "tokens_per_second": rate,
        "tokens_per_forward": 1.5,
        "latency_s": 0.01,
        "nfe": 8.0,
        "n": N_EXAMPLES,
    }


def _tradeoff() -> dict:
    return {
        "setdlm_vs_ar": {
            "speedup": 1.8,
            "ci95": [1.5, 2.1],
            "max_drop": 0.02,
            "reference": _point("threshold=off window=4", 0.75, 900.0),
            "setdlm": _point("threshold=0.9 window=8", 0.74, 1800.0),
            "ar": _point("default", 0.8, 1000.0),
            "forward_cost_ratio": 1.1,
            "selected_on": {"split": "validation", "n": 200},
            "test_drop": {"estimate": 0.01, "ci95": [-0.02, 0.04]},
            "anchor": "ar",
            "accuracy_diff": {"estimate": -0.06, "ci95": [-0.09, -0.03]},
            "lossy": [
                {
                    "setdlm": _point("threshold=0.7 window=8", 0.7, 2500.0),
                    "speedup": 2.5,
                    "ci95": [2.2, 2.8],
                    "accuracy_diff": {"estimate": -0.1, "ci95": [-0.14, -0.06]},
                }
            ],
        },
        "setdlm_vs_bd3lm": {"missing": "no bd3lm rows"},
        "aogpt_vs_mdlm": {"missing": "no aogpt rows"},
        "points": [],
        "ar_engines": {
            "vllm:greedy": {
                "engine_over_own_ar": 3.0,
                "ci95": [2.5, 3.5],
                "engine": _point("greedy", 0.8, 3000.0) | {"engine": "vllm"},
                "own_ar": _point("greedy", 0.8, 1e3),
                "setdlm_vs_vllm": 0.6,
            }
        },
    }


def _models(root: Path, task: str, paradigm: str, rng: np.random.Generator) -> None:
    exact = paradigm == "ar"
    ppl = float(6 + 4 * rng.random())
    _json(
        root / f"metrics/evaluate/{task}/{paradigm}.json",
        {
            "task": task,
            "paradigm": paradigm,
            "nll_per_token": float(np.log(ppl)),
            "ppl": ppl,
            "likelihood_is_exact": exact,
            "n_tokens": 1000,
            "n_sequences": 64,
        },
    )
    _json(
        root / f"metrics/train/{task}/{paradigm}.json",
        {
            "steps": 40,
            "final_train_loss": 1.9,
            "final_eval_loss": 2.0,
            "seconds": 3.0,
            "resumed_from": 0,
            "parameters": 84800,
            "run_id": "abc",
        },
    )
    log = [
        {
            "step": s,
            "train_loss": 3 - s / 30 + rng.random() / 10,
            "eval_loss": 3.1 - s / 30,
            "lr": 1e-3,
            "seconds": s / 10,
        }
        for s in (10, 20, 30, 40)
    ]
    _write(
        root / f"models/{task}/{paradigm}/train_log.jsonl",
        "\n".join(json.dumps(r) for r in log) + "\n",
    )
    # The curve stage's file; no points: this run decodes no validation prompts while training.
    curve = {"task": task, "paradigm": paradigm, "n_examples": 0, "points": []}
    _json(root / f"metrics/curve/{task}/{paradigm}.json", curve)


def _textgen(root: Path, paradigm: str, rng: np.random.Generator) -> None:
    rows = [
        {
            "task": "text",
            "paradigm": paradigm,
            "engine": "setdiff",
            "config": kind,
            "window": None,
            "threshold": None,
            "regime": "latency",
            "concurrency": 1,
            "example": i,
            "prompt_tokens": 30,
            "new_tokens": 20,
            "nfe": 10,
            "latency_s": 0.05,
            "forward_s": 0.04,
            "peak_mem_mb": 310.0,
            "kv_cache_mb": 0.1,
            "score": float(rng.random()),
            "exact": float("nan"),
            "stopped": True,
            "tokens_per_forward": 2.0,
            "tokens_per_second": 400.0,
        }
        for kind in ("infill", "uncond")
        for i in range(10)
    ]
    _write(root / f"results/textgen/text/{paradigm}.csv", pd.DataFrame(rows).to_csv(index=False))
    _json(
        root / f"metrics/textgen/text/{paradigm}.json",
        {
            "task": "text",
            "paradigm": paradigm,
            "infill_rouge_l": float(np.mean([r["score"] for r in rows if r["config"] == "infill"])),
            "infill_exact": 0.1,
            "uncond_gen_ppl": 80.0,
            "uncond_unigram_entropy": 4.2,
            "uncond_distinct_1": 0.5,
            "uncond_distinct_2": 0.8,
            "uncond_distinct_3": 0.9,
            "my_new_metric": 42.0,
            "decode_options": {"window": 4},
            "fingerprint": {"threads": 1},
        },
    )


def _trials(rng: np.random.Generator) -> pd.DataFrame:
    records = []
    for number in range(24):
        set_size, window = int(rng.choice([2, 4, 8])), int(rng.choice([4, 8]))
        state = "COMPLETE" if number % 6 else "PRUNED"
        accuracy = 0.9 - 0.04 * set_size + rng.random() / 20
        rate = 100.0 * set_size + 5 * window + rng.random()
        records.append(
            {
                "number": number,
                "state": state,
                "accuracy": accuracy,
                "tokens_per_second": rate,
                "nfe_mean": 12.0 / set_size,
                "param_set_size": set_size,
                "param_window": window,
                "param_threshold": 0.9,
            }
        )
    frame = pd.DataFrame(records)
    done = frame["state"] == "COMPLETE"
    frame["is_pareto"] = False
    frame.loc[done, "is_pareto"] = stats.pareto_mask(frame[done], "tokens_per_second")
    return frame


BACKBONE = {
    "task": "arith",
    "n_examples": 100,
    "rows": [
        {"variant": "base", "parameters": 1000, "model": {"n_head": 2}, "ar": 0.9,
         "setdlm_d2": 0.7, "setdlm_d2_w1": 0.75, "setdlm_d2_eval_loss": 0.3},
        {"variant": "4-heads", "parameters": 1000, "model": {"n_head": 4}, "ar": 0.96,
         "setdlm_d2": 0.95, "setdlm_d2_w1": 0.94, "setdlm_d2_eval_loss": 0.2},
        {"variant": "later", "missing": "not run yet (setdiff backbone computes it)"},
    ],
}  # fmt: skip


SEEDS = {
    "task": "arith",
    "n_examples": 200,
    "steps": None,
    "paradigms": {
        "setdlm": {
            "seeds": [1, 2],
            "accuracies": [0.7, 0.66],
            "n": 2,
            "mean": 0.68,
            "sd": 0.0283,
            "binomial_se": 0.033,
            "steps": 300,
            "recipe_seed": 0,
            "recipe_steps": 300,
        }
    },
}


SETSIZE = {
    "task": "arith",
    "n_examples": 200,
    "main": {"setdlm": {"set_size": 4, "window": 4}},
    "rows": [
        {"paradigm": "setdlm", "set_size": 2, "window": 2, "accuracy": 0.93, "n_examples": 200,
         "steps": 300, "seed": 0},
    ],
}  # fmt: skip


LMEVAL = {
    "task": "arith",
    "n_examples": 20,
    "engines": {
        name: {"status": "ran", "lmeval_accuracy": acc, "setdiff_accuracy": acc, "n": 20,
               "same_text": 20, "same_verdict": 20, "disagreements": []}
        for name, acc in (("ar", 0.95), ("setdlm", 0.8), ("vllm", 0.95))
    },
}  # fmt: skip


def write_run(root: Path, seed: int = 0, speed: float = 1.0, preset: str = "test") -> Path:
    """A complete synthetic run: bench (+ traces, baseline), tradeoff, evaluate, train, textgen,
    ablation trials, params.yaml and dvc.lock."""
    rng = np.random.default_rng(seed)
    params = {
        "preset": preset,
        "study": {"tasks": ["arith", "text"], "paradigms": list(PARADIGMS)},
        "bench": {"tasks": ["arith"], "sweep": {p: {} for p in PARADIGMS}},
        "data": {"seed": 0, "arith": {"n_train": 2000, "n_valid": 100, "n_test": 100}},
        "train": {"arith": {"ar": {"steps": 40, "threads": 2}, "diffusion": {"steps": 20}}},
    }
    _write(root / "params.yaml", yaml.safe_dump(params))
    rows, traces = _bench("arith", rng, speed)
    _write(root / "results/bench/arith.csv", pd.DataFrame(rows).to_csv(index=False))
    # the validation rows the tradeoff chooses on (bench.run.n_select): a sidecar, not a task
    _write(root / "results/bench/arith.select.csv", pd.DataFrame(rows[:10]).to_csv(index=False))
    _write(root / "results/bench/arith.traces.jsonl", "\n".join(map(json.dumps, traces)) + "\n")
    configs = [
        {"paradigm": p, "config": c[0], "options": {}} for p in PARADIGMS for c in CONFIGS[p]
    ]
    fingerprint = {
        "device": "cpu",
        "device_name": "x86_64",
        "threads": 1,
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "platform": "Linux",
        "git_revision": f"rev{seed}",
        "params_hash": f"hash{seed}",
        "checkpoint_sha256": {"ar": "00ff"},
    }
    _json(
        root / "results/bench/arith.json",
        {
            "task": "arith",
            "configurations": configs,
            "run": {"n_examples": N_EXAMPLES},
            "fingerprint": fingerprint,
        },
    )
    _write(root / "results/baseline/arith.csv", pd.DataFrame(_baseline("arith", rng)).to_csv())
    engines = {
        "setdiff": {"status": "ran"},
        "transformers": {"status": "ran"},
        "vllm": {"status": "ran", "base_url": "http://127.0.0.1:8000/v1", "throughput": THROUGHPUT},
    }
    _json(root / "results/baseline/arith.json", {"task": "arith", "engines": engines})
    _json(root / "metrics/tradeoff/arith.json", _tradeoff())
    for task in ("arith", "text"):
        for paradigm in PARADIGMS:
            _models(root, task, paradigm, rng)
    for paradigm in PARADIGMS:
        _textgen(root, paradigm, rng)
    _write(root / "ablations/arith/trials.csv", _trials(rng).to_csv(index=False))
    _json(root / "metrics/backbone/arith.json", BACKBONE)
    _json(root / "metrics/seeds/arith.json", SEEDS)
    _json(root / "metrics/setsize/arith.json", SETSIZE)
    _json(root / "metrics/lossless/arith.json", LOSSLESS)
    _json(root / "metrics/lmeval/arith/summary.json", LMEVAL)
    _json(
        root / "results/throughput/arith.json",
        {"task": "arith", "figures": BATCHED, "against_best_ar": AGAINST_BEST_AR},
    )
    lock = {
        "schema": "2.0",
        "stages": {
            "bench@arith": {
                "cmd": "setdiff bench --task arith",
                "deps": [{"path": "models/arith", "hash": "md5", "md5": "aa11.dir"}],
                "outs": [{"path": "results/bench/arith.csv", "hash": "md5", "md5": "bb22"}],
            }
        },
    }
    _write(root / "dvc.lock", yaml.safe_dump(lock))
    return root


def by_gid(artists: list, prefix: str) -> dict[str, object]:
    return {
        a.get_gid()[len(prefix) :]: a for a in artists if (a.get_gid() or "").startswith(prefix)
    }


def legend_labels(ax: object) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tags: set[str] = set()
        self.attributes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes += [v or "" for _, v in attrs]
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")


def check_self_contained_html(path: Path) -> int:
    """Every <img> is a data: URI holding a valid PNG; nothing points off the page."""
    text = path.read_text()
    assert not re.search(r"https?://", text), "the report references a URL"
    parser = _Html()
    parser.feed(text)
    assert not parser.tags & {"script", "link", "iframe", "object", "embed"}
    for src in parser.images:
        assert src.startswith("data:image/png;base64,"), src[:40]
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        Image.open(io.BytesIO(data)).verify()
    assert all(a.startswith("data:") or "/" not in a for a in parser.attributes if ":" in a)
    return len(parser.images)
