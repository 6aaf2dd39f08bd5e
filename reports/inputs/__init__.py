"""Reading one run's artifacts: tolerant file readers (`files`), the account of what could not be
used (`missing`), per-example rows (`rows`), the tradeoff stage's comparisons (`tradeoff`), the
Optuna study export (`optuna`), and `run.load_run`, which reads them all into one `Run` of tidy
frames. A bad input becomes a `Missing` record, never an exception.
"""
