"""reasoning-gym, the generator and checker behind the ``arith`` and ``gsm`` tasks.

Imported on first use: it takes seconds, and most stages never need it. The checkers are the
generators' own ``score_answer``, built once per dataset name.
"""

from __future__ import annotations

from functools import cache
from typing import Any


def reasoning_gym() -> Any:
    """The ``reasoning_gym`` module, imported on first use."""
    import reasoning_gym

    return reasoning_gym


@cache
def checker(name: str) -> Any:
    """A one-item reasoning-gym dataset `name`, whose ``score_answer`` scores any entry of it."""
    return reasoning_gym().create_dataset(name, size=1, seed=0)
