"""Progress bars: a live bar on a terminal; in a log (a pipe or file, e.g. `dvc repro > log`) one
whole line about every 10 s, never one per step."""

from __future__ import annotations

import io

import pytest
from test_train import copy_task, fresh

from setdiff.paradigm import make_paradigm
from setdiff.progress import LOG_INTERVAL_S, LineProgress, progress_bar
from setdiff.train import TrainConfig, train


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_training_writes_no_line_per_step_to_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig(steps=40, batch_size=4, warmup_steps=1, eval_every=20, eval_examples=4)
    train(fresh(), make_paradigm("ar", mask_id=3), copy_task(32), copy_task(8), config)
    err = capsys.readouterr().err
    assert "\r" not in err
    bar_lines = [line for line in err.splitlines() if line.startswith("train")]
    assert 1 <= len(bar_lines) <= 2, err  # the end (and at most one 10 s line), not 40
    assert "40/40" in bar_lines[-1] and "loss=" in bar_lines[-1]


def test_a_log_gets_one_line_per_interval_and_the_end() -> None:
    now = [0.0]
    sink = io.StringIO()
    with LineProgress(total=100, desc="decode", file=sink, clock=lambda: now[0]) as bar:
        for _ in range(100):
            now[0] += 1.0  # one second per step
            bar.update()
            bar.set_postfix(loss=1.5)
    lines = sink.getvalue().splitlines()
    assert len(lines) == 100 // LOG_INTERVAL_S  # every 10 s (the last one is the end)
    assert all(line.startswith("decode") for line in lines) and "\r" not in sink.getvalue()
    assert "100/100" in lines[-1] and "loss=1.5" in lines[-1]


def test_iterating_a_log_bar_yields_every_item_and_prints_once() -> None:
    sink = io.StringIO()
    assert list(progress_bar(range(5), desc="bench", file=sink)) == list(range(5))
    assert sink.getvalue().count("\n") == 1 and "5/5" in sink.getvalue()


def test_a_terminal_keeps_the_live_bar_and_disable_prints_nothing() -> None:
    live = progress_bar(range(3), desc="x", file=Terminal())
    assert not isinstance(live, LineProgress)
    quiet = io.StringIO()
    with progress_bar(total=3, desc="x", file=quiet, disable=True) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""
