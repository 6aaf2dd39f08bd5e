"""The report's figures and tables as a registry: each `Item` names the input kinds it reads.

`make_items` runs them over a `Derived` run; a missing input leaves an item empty (None) and a
failing item is recorded, never raised, so one bad artifact cannot sink the report. The build
(`reports.build`) and comparison (`reports.diff`) modules decide how items are laid out.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import pandas as pd
from matplotlib.figure import Figure

from reports.analysis import stats
from reports.inputs import optuna
from reports.inputs.missing import Missing
from reports.inputs.run import KINDS, Run
from reports.render import figures, tables

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Derived:
    """A run plus the frames every figure reads, computed once."""

    run: Run
    points: pd.DataFrame
    """`stats.summarize_configs` of bench + baseline rows."""
    orders: pd.DataFrame
    sizes: pd.DataFrame


def derive(run: Run) -> Derived:
    """Summaries and trace analytics of a loaded run; a failure empties that frame and is
    recorded in ``run.missing`` (never raised)."""

    def guarded(make: Callable[[], pd.DataFrame], kind: str, what: str) -> pd.DataFrame:
        try:
            return make()
        except Exception as err:  # noqa: BLE001 - reported in "Missing inputs", see docstring
            log.exception("could not derive %s", what)
            problem = f"unusable for {what}: {type(err).__name__}: {err}"
            run.missing.append(Missing(KINDS[kind], problem, kind))
            return pd.DataFrame()

    return Derived(
        run=run,
        points=guarded(
            lambda: stats.summarize_configs(run.rows, run.throughput), "bench", "summaries"
        ),
        orders=guarded(lambda: stats.trace_orders(run.traces), "traces", "decode orders"),
        sizes=guarded(lambda: stats.trace_set_sizes(run.traces), "traces", "set sizes"),
    )


Output = Figure | pd.DataFrame | None


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    """One figure or table of the report and the input kinds (`load.KINDS`) it reads."""

    name: str
    title: str
    section: str
    needs: tuple[str, ...]
    make: Callable[[Derived], Output]
    caption: str = ""
    folded: bool = False
    """A table of details, rendered closed (`reports.render.document.Table.folded`)."""


def tokens_per_forward(points: pd.DataFrame) -> dict[tuple[str, str, str], float]:
    """(task, paradigm, config) -> tokens per forward of our engine's bench configurations."""
    if points.empty:
        return {}
    ours = points[(points["engine"] == "setdiff") & (points.get("source", "bench") == "bench")]
    return {
        (r.task, r.paradigm, r.config): float(r.tokens_per_forward)
        for r in ours.itertuples(index=False)
    }


def fine_tune_starts(run: Run) -> dict[str, float]:
    """Per task: the AR model's last logged step, when its diffusion models start from it
    (``train.<task>.init_from_ar``, true unless the params say otherwise)."""
    log, train = run.train_log, run.params.get("train")
    if log.empty or "paradigm" not in log:
        return {}
    ar = log[log["paradigm"] == "ar"].groupby("task")["step"].max()
    recipes = train if isinstance(train, dict) else {}
    return {
        str(task): float(step)
        for task, step in ar.items()
        if not isinstance(recipes.get(task), dict) or recipes[task].get("init_from_ar", True)
    }


def _when(frame: pd.DataFrame, make: Callable[[pd.DataFrame], Output]) -> Output:
    return None if frame.empty else make(frame)


def ablation_knobs(trials: pd.DataFrame) -> tuple[str, str | None] | None:
    """Heatmap axes: set size x window where they vary, else the knobs with the most levels."""
    knobs = [c for c in trials.columns if c.startswith("param_") and trials[c].nunique() > 1]
    preferred = [k for k in ("param_set_size", "param_window") if k in knobs]
    rest = sorted(set(knobs) - set(preferred), key=lambda c: (-trials[c].nunique(), c))
    chosen = (preferred + rest)[:2]
    if not chosen:
        return None
    return chosen[0], (chosen[1] if len(chosen) > 1 else None)


def _ablation_heatmaps(d: Derived) -> Output:
    trials = d.run.trials
    if trials.empty:
        return None
    if "paradigm" in trials and trials["paradigm"].nunique() > 1:
        # Knobs mean different things per paradigm: map the method the study is about.
        trials = trials[trials["paradigm"] == "setdlm"]
    trials = stats.bin_knobs(trials)
    axes = ablation_knobs(trials)
    return None if axes is None else figures.plot_ablation_heatmaps(trials, *axes)


def _window_threshold(d: Derived) -> Output:
    grid = stats.knob_grid(d.points) if not d.points.empty else pd.DataFrame()
    if len(grid) < 2:
        return None
    return figures.plot_ablation_heatmaps(grid, "param_window", "param_threshold")


TRADEOFF, ABLATION, DECODE = "Speed–quality trade-offs", "Ablations", "Decode order"
LIKELIHOOD, TEXTGEN, TRAINING, PROVENANCE = (
    "Likelihood",
    "Text generation",
    "Training",
    "Provenance",
)
SECTIONS = (TRADEOFF, ABLATION, DECODE, LIKELIHOOD, TEXTGEN, TRAINING, PROVENANCE)

ITEMS: tuple[Item, ...] = (
    Item(
        name="quality_vs_throughput",
        title="Accuracy vs tokens/s",
        section=TRADEOFF,
        needs=("bench", "baseline"),
        make=lambda d: _when(d.points, figures.plot_quality_vs_throughput),
        caption=(
            "One point per configuration with its 95% Wilson interval (accuracy); the line is each "
            "series' Pareto front; labels mark the configurations on the task's overall front "
            "(τ threshold, W window). Each AR engine is one series (our decoder: `ar`)."
        ),
    ),
    Item(
        name="quality_vs_tokens_per_forward",
        title="Accuracy vs tokens per forward",
        section=TRADEOFF,
        needs=("bench", "baseline", "lossless"),
        make=lambda d: _when(
            d.points, lambda p: figures.plot_quality_vs_tokens_per_forward(p, d.run.lossless)
        ),
        caption=(
            "Tokens decoded per model call: the parallelism a paradigm extracts, independent of "
            "hardware. Hollow markers: the lossless stage's speculative decoders (each exactly "
            "its reference greedy decode; tokens per forward of the main model)."
        ),
    ),
    Item(
        name="quality_vs_latency",
        title="Accuracy vs latency",
        section=TRADEOFF,
        needs=("bench", "baseline"),
        make=lambda d: _when(d.points, figures.plot_quality_vs_latency),
        caption="Mean per-example latency (prefill included); the front runs to the upper left.",
    ),
    Item(
        name="best_configs",
        title="Best configuration per paradigm",
        section=TRADEOFF,
        needs=("bench", "baseline"),
        make=lambda d: _when(d.points, tables.best_config_table),
        caption=(
            "Most accurate configuration of each series (fastest among ties); accuracy with its "
            "95% Wilson interval."
        ),
    ),
    Item(
        name="speedups",
        title="Speedup at matched accuracy",
        section=TRADEOFF,
        needs=("tradeoff",),
        make=lambda d: _when(d.run.comparisons, tables.speedup_table),
        caption=(
            "From `metrics/tradeoff/<task>.json`: speed ratio at matched accuracy with a paired "
            "bootstrap 95% CI."
        ),
    ),
    Item(
        name="seed_variance",
        title="Seed variance",
        section=TRADEOFF,
        needs=("seeds",),
        make=lambda d: _when(
            d.run.seeds, lambda f: tables.seeds_table(f, d.run.evaluate, d.run.train)
        ),
        caption=(
            "`setdiff seeds`: every paradigm trained per training seed (init, data order, "
            "training noise); with AR among them each seed trains its own AR model and that "
            "seed's fine-tunes start from it, and each row's gap is to the same seed's AR. The "
            "recipe's own seed, marked (main run), is the main run's models, scored, not trained "
            "again (the same weights on one kind of host). Greedy "
            "exact match on the first test prompts; tokens/forward is the mean over seeds. An sd "
            "above one run's binomial SE means the accuracy intervals above (prompts, one "
            "model) understate how far a retrained model moves; sd > 0.03 flags a recipe that "
            "does not hold on every seed. The main run's accuracy is joined where the study "
            "trained as many steps as the main run's model; the steps column says how many."
        ),
    ),
    Item(
        name="lossless",
        title="Lossless decoders: setdlm verify against AR with speculative decoding",
        section=TRADEOFF,
        needs=("lossless",),
        make=lambda d: _when(d.run.lossless, tables.lossless_table),
        caption=(
            "`setdiff lossless`: every method decodes every test prompt greedily at batch 1, "
            "interleaved per example; each lossless method's tokens are compared with its "
            "reference on every prompt (AR for the AR methods, setdlm W = 1 for verify). The "
            "draft size k and the window W are the fastest on the validation prompts; the "
            "test prompts are read once. Ratios with paired 95% bootstrap CIs over prompts. "
            "vLLM's own speculative decoding (its n-gram proposer, `vllm+ngram k=K`) runs in "
            "the baseline stage, timed beside our AR on that stage's prompts: see the AR "
            "engines table and the speedup table's engine rows."
        ),
    ),
    Item(
        name="aup",
        title="Accuracy under parallelism (AUP)",
        section=TRADEOFF,
        needs=("bench", "lossless"),
        make=lambda d: tables.aup_table(d.points, d.run.lossless),
        caption=(
            "d3LLM's hardware-independent score of a method's accuracy-vs-tokens-per-forward "
            "curve (hao-ai-lab/d3LLM): accuracy y in points, tokens per forward rho; the points "
            "within 5 points of the lowest-rho point's accuracy, AUP = rho_1 y_1 + the "
            "trapezoids of y W(y), W(y) = min(exp(-3 (1 - y / y_max)), 1), y_max the task's best "
            "accuracy of any method. Each paradigm over its bench Pareto front (batch 1, greedy "
            "and thresholded points); each lossless speculative method as its one point. Plain "
            "AR scores its accuracy. Test prompts; no CI (a sum over operating points)."
        ),
    ),
    Item(
        name="set_size",
        title="Set size",
        section=TRADEOFF,
        needs=("setsize",),
        make=lambda d: _when(
            d.run.setsize, lambda f: tables.setsize_table(f, d.run.evaluate, d.run.train)
        ),
        caption=(
            "`setdiff setsize`: setdlm (window W = D) and bd3lm at other set sizes D than the main "
            "run's, fine-tuned from the AR model or on from the main run's model "
            "(`setsize.start`), and the main run's setdlm decoded at W = D without training; "
            "greedy exact match on the evaluate stage's test prompts [95% Wilson interval]; "
            "the gap is to the main run's AR."
        ),
    ),
    Item(
        name="baseline_engines",
        title="Baseline engines",
        section=TRADEOFF,
        needs=("baseline",),
        make=lambda d: _when(d.run.engines, lambda f: tables.engines_table(f, d.run.throughput)),
        caption=(
            "Which AR engines ran in the baseline stage (`results/baseline/<task>.json`), and "
            "the throughput regime on its prompts: aggregate tokens/s of our AR "
            "(`generate_batch`) and transformers (batched `generate`) at each batch size, and of "
            "vLLM at each concurrency (requests in flight)."
        ),
    ),
    Item(
        name="batched_throughput",
        title="Throughput regime: tokens/s vs batch size",
        section=TRADEOFF,
        needs=("batched",),
        make=lambda d: _when(d.run.batched, figures.plot_batched_throughput),
        caption=(
            "From `results/throughput/<task>.json`: each configuration and batched AR decode the "
            "same prompts with `generate_batch`, interleaved per batch, warm-up excluded; "
            "tokens/s = all rows' new tokens over wall time (dashed: AR)."
        ),
    ),
    Item(
        name="batched_throughput_table",
        title="Throughput regime: where set decoding stops beating the best batched AR",
        section=TRADEOFF,
        needs=("batched",),
        make=lambda d: _when(d.run.batched, tables.batched_table),
        caption=(
            "tokens/s at 3 significant figures (ratio to the fastest AR engine at the same batch "
            "size: ours or transformers' batched `generate`, or ours alone when transformers did "
            "not run); the crossover is the smallest batch size where that ratio falls below 1. "
            "Accuracy is the same at every batch size when every row equals its batch-1 decode."
        ),
    ),
    Item(
        name="lmeval",
        title="lm-evaluation-harness vs our scorer",
        section=TRADEOFF,
        needs=("lmeval",),
        make=lambda d: _when(d.run.lmeval, tables.lmeval_table),
        caption=(
            "`setdiff lmeval`: the same first test prompts through lm-eval (task "
            "`setdiff_<task>`: its regex extraction and exact match) and through the evaluate "
            "stage's decoding and scorer; vLLM serves the AR export to lm-eval's "
            "`local-completions` client and is compared with our AR. The scorers differ only on "
            "answers equal as numbers but not as strings (`+5`, `05`, `5.0`): ours accepts them."
        ),
    ),
    Item(
        name="window_threshold_heatmap",
        title="setdlm sweep: window x threshold",
        section=ABLATION,
        needs=("bench",),
        make=_window_threshold,
        caption="Bench sweep of setdlm decode knobs (one cell per configuration).",
    ),
    Item(
        name="ablation_heatmaps",
        title="Ablation heatmaps",
        section=ABLATION,
        needs=("trials",),
        make=_ablation_heatmaps,
        caption="Mean over completed Optuna trials per knob cell (other knobs averaged out).",
    ),
    Item(
        name="optuna_pareto",
        title="Optuna Pareto front",
        section=ABLATION,
        needs=("trials",),
        make=lambda d: _when(
            d.run.trials, lambda t: figures.plot_optuna_pareto(t, optuna.front_axis(t))
        ),
        caption=(
            "Completed trials in (speed objective, accuracy); the study's Pareto-optimal trials "
            "in their paradigm's colour, joined by the staircase bounding the dominated region."
        ),
    ),
    Item(
        name="set_size_histogram",
        title="Tokens accepted per forward",
        section=DECODE,
        needs=("traces",),
        make=lambda d: _when(
            d.sizes, lambda f: figures.plot_set_size_histogram(f, tokens_per_forward(d.points))
        ),
        caption=(
            "Share of forwards that committed k tokens, per paradigm and configuration (a "
            "forward may also commit positions after EOS, which the bars count). The legend "
            "gives tokens per forward as every table and figure defines it: new tokens up to "
            "EOS over forwards."
        ),
    ),
    Item(
        name="kendall_tau",
        title="Decode order vs left-to-right",
        section=DECODE,
        needs=("traces",),
        make=lambda d: _when(d.orders, figures.plot_kendall_tau),
        caption=(
            "Kendall's tau-b between position and decoding forward, one dot per example "
            "(1 = left-to-right; positions decoded in the same forward count as ties)."
        ),
    ),
    Item(
        name="frontier_distance",
        title="Window occupancy",
        section=DECODE,
        needs=("traces",),
        make=lambda d: _when(d.orders, figures.plot_frontier_distance),
        caption=(
            "How far right of the leftmost undecoded position the decoder commits tokens "
            "(mean per example; 0 = strictly left-to-right)."
        ),
    ),
    Item(
        name="likelihood",
        title="Perplexity",
        section=LIKELIHOOD,
        needs=("evaluate",),
        make=lambda d: _when(d.run.evaluate, tables.likelihood_table),
        caption=(
            "`=` exact likelihood, `≤` an upper bound (NELBO), as each evaluate stage reports "
            "it (`likelihood_is_exact`)."
        ),
    ),
    Item(
        name="textgen",
        title="Text generation quality",
        section=TEXTGEN,
        needs=("textgen", "textgen_rows"),
        make=lambda d: _when(d.run.textgen, lambda f: tables.textgen_table(f, d.run.textgen_rows)),
        caption="All numeric metrics of `metrics/textgen`; infill ROUGE-L with a 95% bootstrap CI.",
    ),
    Item(
        name="backbone_study",
        title="Backbone study: AR -> set-diffusion adaptation",
        section=TRAINING,
        needs=("backbone",),
        make=lambda d: _when(d.run.backbone, tables.backbone_table),
        caption=(
            "`setdiff backbone`: per backbone variant, AR trained from scratch and setdlm "
            "fine-tuned from it at each D with the same budget and seed; greedy exact match on "
            "the first test prompts, threshold off [95% Wilson interval], one seed."
        ),
    ),
    Item(
        name="training_curves",
        title="Training curves",
        section=TRAINING,
        needs=("train_log",),
        make=lambda d: _when(
            d.run.train_log, lambda f: figures.plot_training_curves(f, fine_tune_starts(d.run))
        ),
        caption="Train loss (left) and eval loss (right) vs step, per paradigm.",
    ),
    Item(
        name="training",
        title="Training summary",
        section=TRAINING,
        needs=("train",),
        make=lambda d: _when(d.run.train, tables.training_table),
        caption="seconds: each training's wall time on its recipe's `threads` (`make run` "
        "runs stages side by side as the cores allow, `flows.lanes`).",
    ),
    Item(
        name="run_facts",
        title="Run facts",
        section=PROVENANCE,
        needs=("params",),
        make=lambda d: _when(
            pd.DataFrame([d.run.params]) if d.run.params else pd.DataFrame(),
            lambda _: tables.run_facts_table(d.run.params, d.run.comparisons, d.run.fingerprints),
        ),
        caption="From params.yaml, the bench fingerprint and the tradeoff stage's choices.",
    ),
    Item(
        name="fingerprint",
        title="Device and library versions",
        section=PROVENANCE,
        needs=("bench_meta",),
        make=lambda d: _when(d.run.fingerprints, tables.fingerprint_table),
        caption="The bench fingerprint of each task (`results/bench/<task>.json`).",
    ),
    Item(
        name="dvc_lock",
        title="dvc.lock",
        section=PROVENANCE,
        needs=("lock",),
        make=lambda d: _when(d.run.lock, tables.lock_table),
        caption=(
            "One hash per stage (sha256 of its locked deps and outs, first 12 hex digits) and "
            "one for the whole lock (`all`); every file's md5 is in `dvc.lock` itself."
        ),
        folded=True,
    ),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Made:
    """An item with what it produced (None: inputs missing) or the error it raised."""

    item: Item
    output: Output
    error: str | None = None


def make_items(derived: Derived, items: Sequence[Item] = ITEMS) -> list[Made]:
    """Run every item; a failure is recorded (and reported), not raised."""
    made = []
    for item in items:
        try:
            made.append(Made(item, item.make(derived)))
        except Exception as err:  # noqa: BLE001 - one bad input must not sink the whole report
            log.exception("report item %s failed", item.name)
            made.append(Made(item, None, f"{type(err).__name__}: {err}"))
    return made
