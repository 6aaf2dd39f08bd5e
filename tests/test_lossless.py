"""The lossless bench (`setdiff.bench.lossless.compare`): lossless methods are counted identical
to their reference on every prompt, AR is the unit of speed, and the drafts' acceptance is read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_run import RECIPE, tiny_params

from setdiff.bench.lossless import Decoded, _ours, compare
from setdiff.config import ConfigError
from setdiff.model import Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID, EOS = 3, 2
PROMPTS = [[1], [1, 5, 7], [1, 5, 7, 9, 11, 13, 15], [1, 4]]


class _Model:
    """A `Decodable` made of a backbone and a paradigm."""

    def __init__(self, net: Transformer, paradigm: object) -> None:
        self.net, self.paradigm, self.tokenizer = net, paradigm, None


def test_lossless_methods_equal_their_reference(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    net = make_tiny_model(seed=1, head_scale=20.0)
    ar = _Model(net, make_paradigm("ar", mask_id=MASK_ID))
    draft = _Model(make_tiny_model(seed=2, head_scale=20.0), make_paradigm("ar", mask_id=MASK_ID))
    setdlm = _Model(net, make_paradigm("setdlm", SetDLMConfig(shift=True), mask_id=MASK_ID))
    seq_len = 24
    decoders = {
        "ar": _ours(ar, seq_len, EOS),
        "ar+self k=3": _ours(ar, seq_len, EOS, draft=ar, draft_tokens=3),
        "ar+draft k=2": _ours(ar, seq_len, EOS, draft=draft, draft_tokens=2),
        "setdlm W=1": _ours(setdlm, seq_len, EOS, window=1),
        "setdlm verify W=4": _ours(setdlm, seq_len, EOS, window=4, verify=True),
        "setdlm W=4": _ours(setdlm, seq_len, EOS, window=4),
    }
    references = {
        "ar+self k=3": "ar",
        "ar+draft k=2": "ar",
        "setdlm verify W=4": "setdlm W=1",
        "setdlm W=4": "setdlm W=1",
    }
    figures = compare(
        decoders,
        references,
        PROMPTS,
        lambda tokens, i: float(i % 2),
        eos_id=EOS,
        warmup=PROMPTS[0],
        best_of=("ar+self k=3", "ar+draft k=2"),
        n_boot=50,
    )
    n = len(PROMPTS)
    # against the fastest AR + speculative method: every other method but AR and the baselines
    fastest = max(("ar+self k=3", "ar+draft k=2"), key=lambda m: figures[m]["tokens_per_second"])
    versus = figures["setdlm verify W=4"]["speedup_vs_best"]
    assert versus["baseline"] == fastest
    ratio = (
        figures["setdlm verify W=4"]["tokens_per_second"] / figures[fastest]["tokens_per_second"]
    )
    assert versus["estimate"] == pytest.approx(ratio)
    assert "speedup_vs_best" not in figures["ar"] and "speedup_vs_best" not in figures[fastest]
    for name in ("ar+self k=3", "ar+draft k=2", "setdlm verify W=4"):
        assert figures[name]["identical_to_reference"] == n, name
        assert figures[name]["draft_acceptance"] is not None, name
    assert figures["ar+self k=3"]["draft_acceptance"] == 1.0  # the model drafting for itself
    assert figures["ar+self k=3"]["tokens_per_forward"] > 2
    assert figures["ar"]["speedup_vs_ar"]["estimate"] == 1.0
    assert figures["ar"]["reference"] is None and figures["ar"]["draft_acceptance"] is None
    assert figures["setdlm W=4"]["identical_to_reference"] < n  # a lossy decode is counted so
    assert all(f["accuracy"] == 0.5 and f["n"] == n for f in figures.values())


def test_decoded_defaults() -> None:
    assert Decoded([1, 2], 2).drafts == (0, 0)


PARAMS: dict[str, Any] = tiny_params(
    paradigm={"ar": {}, "setdlm": {"set_size": 2, "shift": True}},
    lossless={
        "draft": {"n_layer": 1, "d_model": 16, "n_head": 2, "d_ff": 32},
        "draft_train": {**RECIPE, "checkpoint_every": 3},
        "draft_tokens": [1, 2],
        "windows": [2, 3],
        "n_select": 3,
        "n_examples": 4,
        "transformers": True,
    },
)


def test_the_stage_chooses_on_validation_and_measures_the_test_prompts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Draft trained and kept; every k and W on the validation prompts, then only the fastest
    on the test prompts (read once), with transformers' engines; every method lossless."""
    from setdiff.stages import lossless, prepare, tokenize
    from setdiff.stages import train as train_stage

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(PARAMS))
    args = ["--params", str(path), "--task", "arith", "--root", str(tmp_path)]
    prepare.main(args)
    tokenize.main(args)
    for paradigm in ("ar", "setdlm"):
        train_stage.main([*args, "--paradigm", paradigm])
    seen: list[tuple[int, list[str]]] = []
    original = lossless.compare

    def spy(decoders, references, prompts, score, **kw):  # type: ignore[no-untyped-def]
        seen.append((len(prompts), list(decoders)))
        return original(decoders, references, prompts, score, **kw)

    monkeypatch.setattr(lossless, "compare", spy)
    lossless.main(args)
    out = json.loads((tmp_path / "metrics" / "lossless" / "arith.json").read_text())
    (n_valid, every), (n_test, chosen) = seen
    assert n_valid == 3 and n_test == 4
    assert set(every) == {
        "ar", "ar+draft k=1", "ar+draft k=2", "hf", "hf+assisted k=1", "hf+assisted k=2",
        "hf+lookup k=1", "hf+lookup k=2", "setdlm W=1", "setdlm verify W=2", "setdlm verify W=3",
    }  # fmt: skip
    k, w = out["selection"]["draft_tokens"], out["selection"]["window"]
    speeds = out["selection"]["tokens_per_second"]
    assert speeds[f"ar+draft k={k}"] == max(speeds["ar+draft k=1"], speeds["ar+draft k=2"])
    assert speeds[f"setdlm verify W={w}"] == max(
        speeds["setdlm verify W=2"], speeds["setdlm verify W=3"]
    )
    assert chosen == [
        "ar", f"ar+draft k={k}", "hf", f"hf+assisted k={k}", f"hf+lookup k={k}",
        "setdlm W=1", f"setdlm verify W={w}",
    ]  # fmt: skip
    figures = out["figures"]
    for name, figure in figures.items():
        if figure["reference"] is not None:
            assert figure["identical_to_reference"] == 4, name
    assert figures[f"setdlm verify W={w}"]["speedup_vs_best"]["baseline"] in chosen[1:5]
    assert out["draft"]["parameters"] < out["regime"]["parameters"]
    assert (tmp_path / "results" / "lossless" / "arith" / "draft" / "model.safetensors").is_file()
    # the report reads what the stage wrote: one row per test method, none missing
    from reports.inputs.run import load_run
    from reports.render import tables

    run = load_run(tmp_path)
    assert not [m for m in run.missing if m.kind == "lossless"]
    table = tables.lossless_table(run.lossless).set_index("method")
    assert list(table.index) == chosen
    assert table.loc[f"setdlm verify W={w}", "identical to its reference"] == "setdlm W=1: 4/4"
    assert table.loc["ar", "× AR [95% CI]"].startswith("1.00")
    assert table.loc[f"setdlm verify W={w}", "× fastest AR + speculative [95% CI]"].endswith(
        f"vs {figures[f'setdlm verify W={w}']['speedup_vs_best']['baseline']}"
    )
    assert table.loc["ar", "× fastest AR + speculative [95% CI]"] == ""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: None, r"models/arith/ar: no model \(run the train stage"),
        (
            lambda p: p["paradigm"]["setdlm"].update(shift=False),
            r"lossless\.windows: verify needs shifted queries",
        ),
        (lambda p: p["lossless"].update(windows=[]), r"lossless.*windows must be >= 1"),
    ],
)
def test_bad_input_stops_the_stage_before_any_compute(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    from setdiff.stages import lossless

    params = json.loads(json.dumps(PARAMS))
    edit(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=message) as err:
        lossless.main(["--params", str(path), "--task", "arith", "--root", str(tmp_path)])
    assert "\n" not in str(err.value)
