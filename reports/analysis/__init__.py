"""Pure computations over a run's tidy frames, no I/O and no drawing: naming and order of series
(`series`), statistics (`stats`: intervals, Pareto fronts, decode-order metrics, accuracy under
parallelism) and the sentences of "What this run shows" (`findings`).
"""
