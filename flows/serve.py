"""``python -m flows.serve``: serve the ablation and pipeline flows as local deployments.

Needs a Prefect server (the UI) on loopback; then trigger runs with parameters::

    export PREFECT_HOME=$PWD/.prefect PREFECT_SERVER_ANALYTICS_ENABLED=false
    prefect server start --host 127.0.0.1 --port 4200 &
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m flows.serve &
    prefect deployment run 'ablation/local-ablation' -p task=arith -p n_trials=8 --watch
    prefect deployment run 'pipeline/local-pipeline' -p preset=smoke --watch

Runs start in this process's working directory (the repository root).
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.ablation import ablation
from flows.pipeline import pipeline


def deployments() -> list[RunnerDeployment]:
    return [
        ablation.to_deployment(
            name="local-ablation",
            parameters={"task": "arith", "params": "params.yaml"},
            description="One Optuna ablation study (params.yaml's `ablation` section).",
        ),
        pipeline.to_deployment(
            name="local-pipeline", description="Every DVC stage in order (`dvc repro`)."
        ),
    ]


def main() -> None:
    serve(*deployments())


if __name__ == "__main__":
    main()
