"""Trade-off reports: read pipeline artifacts (results/, metrics/, ablations/, dvc.lock), write
figures, tables and a Markdown + self-contained HTML report under ``reports/out/``.

Layering: this package reads files only. It never imports ``torch`` or ``setdiff`` (a test checks),
so it runs on any machine that has the artifacts.

Modules: `reader` (tolerant file readers), `load` (artifacts -> tidy DataFrames + what is
missing), `comparison` (metrics/tradeoff -> one record per comparison), `study` (Optuna study
export -> one row per trial), `analysis` (pure derived
statistics: bootstrap CIs, Pareto fronts, decode-order metrics), `figures` and `tables` (one
function per figure / table), `style` (theme and fixed colours), `items` (the registry of
figures/tables and the inputs each reads), `document` (Markdown / HTML rendering), `build` (the
DVC stage ``report``) and `compare` (two runs side by side).
"""
