"""Dataset loader of the setdiff lm-eval tasks: the pipeline's local raw split, never the hub.

lm-eval calls ``custom_dataset(**metadata, **dataset_kwargs)``: ``task`` and ``split`` come from
the task YAML, ``root`` (the directory holding ``data/``) from lm-eval's ``--metadata`` (default:
the working directory); ``limit_records`` keeps the first records only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIELDS = ("prompt", "answer", "question")


def load_split(
    task: str, split: str = "test", root: str = ".", limit_records: int | None = None, **_: Any
) -> dict[str, Any]:
    """``{split: datasets.Dataset}`` of ``<root>/data/<task>/raw/<split>.jsonl``: prompt, answer
    (as a string), question and the record's index."""
    import datasets

    from setdiff.tasks import read_records

    records = read_records(Path(root) / "data" / task / "raw" / f"{split}.jsonl", task)
    if limit_records is not None:
        records = records[:limit_records]
    rows = [
        {"index": i, **{k: str(r[k]) if k == "answer" else r[k] for k in FIELDS}}
        for i, r in enumerate(records)
    ]
    return {split: datasets.Dataset.from_list(rows)}
