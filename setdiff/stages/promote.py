"""Write an ablation study's Pareto configurations into params/<preset>.yaml.

``setdiff promote --task arith --study NAME --preset default [--trials 3,7]`` reads
``ablations/<task>/<study>/study.json``, the export that the ablation flow writes at the end of
every run from the study's storage (journal file or RDB). The library never imports Optuna, so
the flow, which owns the study, exports it; re-running the flow on a finished study only
re-exports. It takes the study's Pareto trials (or the listed ones) and, for each paradigm among
them, rewrites in ``params/<preset>.yaml``:

- ``bench.sweep.<paradigm>``: for each decode option the study varied (window, threshold), the
  values the chosen trials use: the smallest grid holding every chosen configuration (in a list
  of grids, the first; the others, such as setdlm's lossless W = 1 and verify, stay). The bench
  stage measures them side by side with every baseline, and DVC records the numbers;
- ``decode.<paradigm>``: the most accurate chosen configuration (what ``evaluate`` decodes with);
- ``paradigm.<paradigm>``: the training knobs (D, s_max, k), when the study trained; the chosen
  trials must agree on them (one model per paradigm and preset; pick with ``--trials``).

Only those keys change: the file is edited with ruamel.yaml's round-trip mode, so comments, key
order and flow style survive, and the result is validated as a preset before it replaces the
file. Reported numbers then come from ``setdiff preset <name> && dvc repro``.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from setdiff.ablation.knobs import RETRAIN
from setdiff.config import ConfigError
from setdiff.files import write_text
from setdiff.params import Params
from setdiff.validate import validate

DECODE_OPTIONS = {"order": "window", "window": "window", "threshold": "threshold"}
"""Decode knob -> the decode option it sets."""
TRAIN_OPTIONS = {
    "setdlm": {"set_size": "set_size", "max_set_size": "max_set_size", "exponent": "exponent"},
    "bd3lm": {"set_size": "block_size"},
}
"""Training knob -> the paradigm config field it sets, per paradigm."""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="setdiff promote",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", default="arith")
    parser.add_argument("--study", required=True, help="study name (the flow logs it)")
    parser.add_argument("--preset", required=True, help="writes params/<preset>.yaml")
    parser.add_argument("--trials", help="comma-separated trial numbers (default: Pareto set)")
    parser.add_argument("--ablations", default="ablations", help="folder of study exports")
    parser.add_argument("--dir", default="params", help="folder of presets")
    args = parser.parse_args(argv)
    export = Path(args.ablations) / args.task / args.study / "study.json"
    if not export.exists():
        found = sorted(p.parent.name for p in export.parents[1].glob("*/study.json"))
        raise ConfigError(f"no export {export}; studies found: {found} (run the flow first)")
    study = json.loads(export.read_text())
    numbers = [int(n) for n in args.trials.split(",")] if args.trials else study["pareto"]
    chosen = choose(study, numbers)
    path = Path(args.dir) / f"{args.preset}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown preset {args.preset!r}: no {path}")
    write_text(path, promote(path.read_text(), chosen, path))
    print(
        f"{path}: promoted trials {numbers} of {args.study} "
        f"({', '.join(sorted({t['paradigm'] for t in chosen}))}).\n"
        f"Next: setdiff preset {args.preset} && dvc repro"
    )


def choose(study: Mapping[str, Any], numbers: Sequence[int]) -> list[dict[str, Any]]:
    """The exported trials `numbers`, which must all be complete."""
    if not numbers:
        raise ConfigError(
            f"{study['study']} has no feasible Pareto trial yet (constraints "
            f"{study.get('constraints')}); run more trials or name some with --trials"
        )
    trials = {t["number"]: t for t in study["trials"]}
    bad = [n for n in numbers if n not in trials or trials[n]["state"] != "COMPLETE"]
    if bad:
        raise ConfigError(f"trials {bad} are not complete trials of {study['study']}")
    return [trials[n] for n in numbers]


def promote(text: str, chosen: Sequence[Mapping[str, Any]], path: Path) -> str:
    """`text` (a preset) with the chosen trials written in; validated as a preset."""
    rt = YAML(typ="rt")
    rt.preserve_quotes, rt.width = True, 4096
    data = rt.load(text)
    sweep = data.get("bench", {}).get("sweep")
    if sweep is None:
        raise ConfigError(f"{path}: no bench.sweep section to promote into")
    for paradigm in sorted({t["paradigm"] for t in chosen}):
        group = [t for t in chosen if t["paradigm"] == paradigm]
        grids = sweep.get(paradigm)
        if isinstance(grids, list) and grids:  # grids: the first holds the ablated options
            _update(grids[0], _sweep(group))
        else:
            _set(sweep, paradigm, _sweep(group))
        best = max(group, key=lambda t: (t["metrics"]["accuracy"], -t["number"]))
        keys = {DECODE_OPTIONS[k] for t in group for k in t["params"] if k in DECODE_OPTIONS}
        _set(data["decode"], paradigm, {k: best["decode_options"][k] for k in sorted(keys)})
        _set(data["paradigm"], paradigm, _training(group, paradigm))
    out = io.StringIO()
    rt.dump(data, out)
    try:
        validate(Params(yaml.safe_load(out.getvalue()), path))
    except ConfigError as err:
        raise ConfigError(f"the promoted preset would be invalid: {err}") from None
    return out.getvalue()


def _sweep(group: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per varied decode option, the chosen values (strings first; tau high to low)."""
    keys = sorted({DECODE_OPTIONS[k] for t in group for k in t["params"] if k in DECODE_OPTIONS})
    out = {}
    for key in keys:
        values = {json.dumps(t["decode_options"][key]) for t in group}
        numbers = sorted((json.loads(v) for v in values if v[0] != '"'), reverse=key != "window")
        out[key] = sorted(json.loads(v) for v in values if v[0] == '"') + numbers
    return out


def _training(group: Sequence[Mapping[str, Any]], paradigm: str) -> dict[str, Any]:
    """The training knobs the chosen trials share (none when the study did not train)."""
    fields = TRAIN_OPTIONS.get(paradigm, {})
    used = sorted({fields[k] for t in group for k in t["params"] if k in RETRAIN and k in fields})
    configs = {json.dumps({f: t["paradigm_config"][f] for f in used}) for t in group}
    if len(configs) > 1:
        raise ConfigError(
            f"the chosen {paradigm} trials trained different models {sorted(configs)}; a preset "
            "holds one per paradigm: choose trials with --trials"
        )
    return json.loads(configs.pop()) if configs else {}


def _set(section: Any, paradigm: str, values: Mapping[str, Any]) -> None:
    """Update `section[paradigm]` key by key (other keys and the layout stay as they are)."""
    if not values:
        return
    if section.get(paradigm) is None:
        section[paradigm] = _flow(CommentedMap())
    _update(section[paradigm], values)


def _update(node: Any, values: Mapping[str, Any]) -> None:
    """Set `node`'s keys to `values` (lists in flow style), leaving its other keys as they are."""
    for key, value in values.items():
        if isinstance(value, list):
            value = _flow(CommentedSeq(map(_quoted, value)))
        node[key] = _quoted(value)


def _flow(node: Any) -> Any:
    node.fa.set_flow_style()
    return node


def _quoted(value: Any) -> Any:
    # Quoted: YAML 1.1 readers (PyYAML, DVC) take a bare `off` for false.
    return DoubleQuotedScalarString(value) if isinstance(value, str) else value
