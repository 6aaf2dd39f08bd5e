"""Where pretrained assets come from: a local directory, or a Hugging Face hub snapshot.

The one place that decides between the two (models and tokenizers in `setdiff.hf`, GSM8K in
`setdiff.tasks`). A hub id is fetched with `huggingface_hub.snapshot_download`, imported on first
use; under ``HF_HUB_OFFLINE=1`` (the Makefile's default) that is a lookup in the local cache.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
"""What a hub repository id looks like: ``owner/name``."""


def resolve(
    source: str | Path,
    *,
    patterns: Sequence[str],
    needs: str | None = None,
    repo_type: Literal["model", "dataset"] = "model",
) -> Path:
    """`source` as a local directory (holding the file `needs`, when given), or the snapshot of
    the hub repository it names, limited to files matching `patterns`.

    Raises:
        FileNotFoundError: naming `source` when it is neither, or a directory lacks `needs`.
    """
    directory = Path(source)
    if directory.is_dir():
        if needs is not None and not (directory / needs).exists():
            raise FileNotFoundError(f"{directory}: no {needs} (not a Hugging Face directory)")
        return directory
    if isinstance(source, str) and HUB_ID.match(source) and not directory.exists():
        from huggingface_hub import snapshot_download

        logger.info("fetching %s %s from the Hugging Face hub", repo_type, source)
        return Path(snapshot_download(source, repo_type=repo_type, allow_patterns=list(patterns)))
    raise FileNotFoundError(f"{source}: not a local directory (nor a hub id owner/name)")
