"""Prefect flows: orchestration only. They run the `setdiff` CLI and `dvc repro` as subprocesses
and read JSON; they never import torch or `setdiff` (a test holds them to it).

- `flows.ablation`: one Optuna study (trials as tasks, on threads or Dask).
- `flows.pipeline`: the DVC stages in order, each as a ``dvc repro <stage>`` task.
- `flows.serve`: both as local deployments (``python -m flows.serve``).
- `flows.tasks`: the shared tasks (subprocesses, retries for infrastructure faults only, the
  compute concurrency limit).
"""
