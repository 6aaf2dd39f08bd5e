"""Prefect flows: orchestration only. They run the `setdiff` CLI and `dvc repro` as subprocesses
and read JSON; they never import torch or `setdiff` (a test holds them to it).

Direction: DVC runs the flow. ``dvc.yaml`` is the one stage graph and ``dvc repro`` (``make run``)
the entry point; DVC decides what re-runs. A flow is what a stage runs when its work needs a
scheduler (the ``ablate`` stage runs `flows.ablation`, whose trials are ``setdiff trial``
subprocesses, never DVC stages), or a study run by hand. `flows.pipeline` is the one flow that
calls DVC: a front end for the Prefect UI that asks DVC for each stage in ``dvc.yaml`` order and
takes no decision of its own (order from ``dvc.yaml``, skip or re-run from DVC).

- `flows.ablation`: one Optuna study (trials as tasks, on threads or Dask); composes the two below.
- `flows.study`: the Optuna side of a study (seeded sampler, ask/tell rounds, the export).
- `flows.runner`: where a study runs (task runner, storage reachability, the study's lock).
- `flows.pipeline`: the DVC stages in order, each as a ``dvc repro <stage>`` task.
- `flows.lanes`: the ``train`` stages (fine-tunes) through ``dvc repro``, several at a time
  (``make run``; plain Python, no Prefect: a thread pool over ``dvc repro --single-item``).
- `flows.serve`: both as local deployments (``python -m flows.serve``).
- `flows.tasks`: the shared tasks (subprocesses, retries for infrastructure faults only, the
  compute concurrency limit).
"""
