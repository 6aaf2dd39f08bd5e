"""Golden tokens: every paradigm x decode option, recorded once, reproduced by every decode mode.

`tests/golden/decode.json` holds the tokens, per-forward decoded positions and NFE of each case in
`CASES`, decoded one prompt at a time with the KV cache by the engine of 2026-12-04 (main at
b68edb6, before the engine rewrite of the one-engine issue). Each case must come out the same
cached, recomputed (``use_cache=False``), batched (`generate_batch`, mixed prompt lengths) and,
for one case per policy shape, through the static compiled step (``compile_step=True``), so
a rewrite of the decoding loop, the cache or the input builder that changes any decoded token
fails here, whatever the hand-written references also check.

The models are float64 (seeded tiny backbones): a logit tie, the one thing that may legitimately
flip a greedy token between two float kernels, is then far below anything a float32 rounding
difference on another CPU can reach. Sampled cases (temperature 1) draw from the seeded
generator of each row.

Regenerate only for an intended change of decoded output, and say why in the commit:
``python tests/test_golden_decode.py --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from setdiff import generate_batch
from setdiff.model import Transformer
from setdiff.paradigm import (
    AOGPTConfig,
    BD3LMConfig,
    MDLMConfig,
    SetDLMConfig,
    make_paradigm,
)
from setdiff.sampling.loop import GenerateResult, generate

sys.path.insert(0, str(Path(__file__).parent))
from conftest import MASK_ID, build_tiny_model  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "decode.json"
PROMPTS = [[1, 5, 7], [1], [1, 5, 7, 9, 11, 13, 15], [1, 4, 9, 2]]
NEW = [12, 9, 13, 10]
SUFFIXES = [[9, 10], [4], [11, 12, 13], [6]]
STOP_ID = 15

CONFIGS: dict[str, Any] = {
    "ar": lambda shift: None,
    "setdlm": lambda shift: SetDLMConfig(shift=shift),
    "aogpt": lambda shift: AOGPTConfig(shift=shift),
    "bd3lm": lambda shift: BD3LMConfig(shift=shift),
    "mdlm": lambda shift: MDLMConfig(shift=shift),
}

# (paradigm, decode options, extra generate arguments); each runs with shift off and on (ar: off).
OPTIONS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("ar", {}, {}),
    ("ar", {"temperature": 1.0, "top_p": 0.9}, {}),
    ("ar", {}, {"stop_ids": [STOP_ID]}),
    ("setdlm", {"window": 1, "threshold": "off"}, {}),
    ("setdlm", {"window": 4, "threshold": "off"}, {}),
    ("setdlm", {"window": 4, "threshold": 0.5}, {}),
    ("setdlm", {"window": 2, "threshold": 0.05}, {}),
    ("setdlm", {"window": 8, "threshold": 0.2}, {}),
    ("setdlm", {"window": "all", "threshold": 0.5}, {}),
    ("setdlm", {"window": 4, "threshold": 0.5, "temperature": 1.0}, {}),
    ("setdlm", {"window": 4, "threshold": 0.5}, {"stop_ids": [STOP_ID]}),
    ("setdlm", {"window": 4, "threshold": 0.5}, {"suffix": True}),
    ("aogpt", {"order": "random"}, {}),
    ("aogpt", {"order": "confidence"}, {}),
    ("aogpt", {"order": "confidence", "window": 3}, {}),
    ("aogpt", {"final_temperature": 0.5}, {}),
    ("aogpt", {"order": "confidence"}, {"suffix": True}),
    ("bd3lm", {}, {}),
    ("bd3lm", {"threshold": 0.5}, {}),
    ("bd3lm", {"threshold": 0.5, "temperature": 1.0}, {}),
    ("bd3lm", {"threshold": 0.05}, {"stop_ids": [STOP_ID]}),
    ("mdlm", {"chunk_size": 4, "threshold": 0.5}, {}),
    ("mdlm", {"chunk_size": 32, "order": "random"}, {}),
    ("mdlm", {"chunk_size": 5, "threshold": 0.05, "temperature": 1.0}, {}),
    ("mdlm", {"chunk_size": 4}, {"suffix": True}),
]

CASES = [
    (name, shift, options, extra)
    for name, options, extra in OPTIONS
    for shift in ([False] if name == "ar" else [False, True])
]


# The static compiled step (`compile_step=True`) on one case per policy shape: each distinct step
# size compiles its own graph (seconds each on CPU).
COMPILED = [
    ("ar", False, {}, {}),
    ("setdlm", True, {"window": 4, "threshold": 0.5}, {}),
    ("setdlm", True, {"window": 4, "threshold": 0.5}, {"suffix": True}),
    ("aogpt", True, {"order": "confidence"}, {}),
    ("bd3lm", True, {"threshold": 0.05}, {"stop_ids": [STOP_ID]}),
]


def case_id(name: str, shift: bool, options: dict, extra: dict) -> str:
    parts = [name, "shift" if shift else "plain"]
    parts += [f"{k}={v}" for k, v in sorted(options.items())]
    parts += [f"{k}={v}" for k, v in sorted(extra.items())]
    return ",".join(parts)


def golden_model() -> Transformer:
    """A seeded tiny float64 backbone whose confidences are spread out (head scaled by 20)."""
    return build_tiny_model(seed=0, head_scale=20.0).double()


def _args(name: str, shift: bool, extra: dict) -> tuple[Any, dict[str, Any], list | None]:
    paradigm = make_paradigm(name, CONFIGS[name](shift), mask_id=MASK_ID)
    kw = {k: v for k, v in extra.items() if k != "suffix"}
    return paradigm, kw, (SUFFIXES if extra.get("suffix") else None)


def _record(res: GenerateResult) -> dict[str, Any]:
    return {"tokens": res.tokens, "steps": res.steps, "nfe": res.nfe, "stopped": res.stopped}


def decode_alone(
    net: Transformer,
    name: str,
    shift: bool,
    options: dict,
    extra: dict,
    use_cache: bool = True,
    compile_step: bool = False,
) -> list[dict[str, Any]]:
    paradigm, kw, suffixes = _args(name, shift, extra)
    rows = []
    for i, prompt in enumerate(PROMPTS):
        res = generate(
            net,
            prompt,
            max_new_tokens=NEW[i],
            paradigm=paradigm,
            suffix_ids=suffixes[i] if suffixes else None,
            use_cache=use_cache,
            compile_step=compile_step,
            seed=i,
            **kw,
            **options,
        )
        rows.append(_record(res))
    return rows


def decode_batched(
    net: Transformer, name: str, shift: bool, options: dict, extra: dict, use_cache: bool = True
) -> list[dict[str, Any]]:
    paradigm, kw, suffixes = _args(name, shift, extra)
    batch = generate_batch(
        net,
        PROMPTS,
        max_new_tokens=NEW,
        paradigm=paradigm,
        suffixes=suffixes,
        use_cache=use_cache,
        seed=list(range(len(PROMPTS))),
        **kw,
        **options,
    )
    return [_record(res) for res in batch]


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def model() -> Transformer:
    return golden_model()


def test_golden_file_covers_every_case(golden: dict[str, Any]) -> None:
    assert sorted(golden) == sorted(case_id(*case) for case in CASES)


@pytest.mark.parametrize("mode", ["cached", "recomputed", "batched"])
@pytest.mark.parametrize(("name", "shift", "options", "extra"), CASES, ids=lambda v: str(v))
def test_decode_reproduces_golden_tokens(
    golden: dict[str, Any],
    model: Transformer,
    mode: str,
    name: str,
    shift: bool,
    options: dict,
    extra: dict,
) -> None:
    if mode == "batched":
        rows = decode_batched(model, name, shift, options, extra)
    else:
        rows = decode_alone(model, name, shift, options, extra, use_cache=mode == "cached")
    expected = golden[case_id(name, shift, options, extra)]
    for i, (row, want) in enumerate(zip(rows, expected, strict=True)):
        assert row == want, f"prompt {i}: {mode} decode differs from the golden record"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "shift", "options", "extra"), COMPILED, ids=lambda v: str(v))
def test_compiled_step_reproduces_golden_tokens(
    golden: dict[str, Any], model: Transformer, name: str, shift: bool, options: dict, extra: dict
) -> None:
    rows = decode_alone(model, name, shift, options, extra, compile_step=True)
    assert rows == golden[case_id(name, shift, options, extra)]


def write() -> None:
    torch.set_num_threads(1)
    net = golden_model()
    with torch.inference_mode():
        record = {case_id(*case): decode_alone(net, *case) for case in CASES}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(record)} cases to {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_golden_decode.py --write")
    write()
