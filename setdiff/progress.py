"""Progress bars that keep logs readable.

On a terminal `progress_bar` is tqdm's live bar. On a pipe or a file (a `dvc repro` log, CI) a
redrawn bar leaves one carriage-return segment per refresh (tqdm refreshes on every
``set_postfix``, so once per training step); there `LineProgress` prints one whole line about
every `LOG_INTERVAL_S` seconds and one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from tqdm.auto import tqdm

LOG_INTERVAL_S = 10.0
"""Seconds between two progress lines in a log."""


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    initial: int = 0,
    desc: str = "",
    disable: bool = False,
    file: IO[str] | None = None,
) -> Any:
    """A tqdm bar on a terminal (or when disabled), else a `LineProgress` (same calls: iterate,
    ``update``, ``set_postfix``, ``close``, ``with``). `file` defaults to stderr, as tqdm's."""
    stream = file if file is not None else sys.stderr
    if disable or _is_terminal(stream):
        options = {"total": total, "initial": initial, "desc": desc, "disable": disable}
        return tqdm(iterable, file=stream, dynamic_ncols=True, **options)
    return LineProgress(iterable, total=total, initial=initial, desc=desc, file=stream)


class LineProgress:
    """A progress record for logs: ``desc: 40%|####      | 4/10 [00:02<00:03, 2.0it/s, k=v]``,
    one line per `interval` seconds at most, and a last one when closed."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: int | None = None,
        initial: int = 0,
        desc: str = "",
        file: IO[str],
        interval: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.initial, self.desc = iterable, total, initial, desc
        self.file, self.interval, self.clock = file, interval, clock
        self.n, self.postfix, self.closed = initial, "", False
        self.started = self.last_print = clock()
        self.printed_n: int | None = None

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None, "LineProgress: nothing to iterate (give an iterable)"
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last_print >= self.interval:
            self._print()

    def set_postfix(self, **values: object) -> None:
        """Shown on the next line (never printed by itself)."""
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def close(self) -> None:
        if not self.closed and self.printed_n != self.n:
            self._print()
        self.closed = True

    def _print(self) -> None:
        now = self.clock()
        line = tqdm.format_meter(
            self.n,
            self.total,
            now - self.started,
            prefix=self.desc,
            postfix=self.postfix or None,
            initial=self.initial,
            ascii=True,
        )
        self.file.write(line + "\n")
        self.file.flush()
        self.last_print, self.printed_n = now, self.n


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
