"""The progress bar every long command draws on stderr, only when it is a terminal."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

from .output import quiet


class WholeElapsed(ProgressColumn):
    """Time since the bar was made: the whole command's, where rich's elapsed column
    shows the task's, which stops once a phase fills the bar."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.monotonic()

    def render(self, task: Task) -> Text:
        elapsed = timedelta(seconds=int(time.monotonic() - self.started))
        return Text(str(elapsed), style="progress.elapsed")


class ProgressBar:
    """One bar, refilled by each phase reported (the search's enumerate, bound, price;
    compare's rows; sweep's scenarios)."""

    def __init__(self, console: Console | None = None) -> None:
        # The console is made for stderr: one made for stdout and pointed at stderr
        # afterwards keeps stdout's verdict on whether it is interactive, so with stdout
        # redirected (`--json > plan.json`) the bar never drew.
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            WholeElapsed(),
            transient=True,
            console=console or Console(file=sys.stderr),
        )
        self.task: TaskID | None = None
        self.phase = ""

    def update(self, phase: str, done: int, total: int) -> None:
        if self.task is None:  # the task first, so the first frame names the phase
            self.task = self.bar.add_task(phase, total=total, completed=done)
            self.bar.start()
        elif phase != self.phase:
            # A new phase refills the bar from its own start: the last phase, filled,
            # had marked the task finished, which an update would not undo.
            self.bar.reset(self.task, total=total, completed=done, description=phase)
        else:
            self.bar.update(self.task, completed=done)
        self.phase = phase

    def stop(self) -> None:
        if self.task is not None:
            self.bar.stop()


def progress_bar() -> ProgressBar | None:
    """A bar where one can be seen: stderr a terminal, not ``-q``, no ``NDPLAN_NO_PROGRESS``."""
    if sys.stderr.isatty() and not os.environ.get("NDPLAN_NO_PROGRESS") and not quiet():
        return ProgressBar()
    return None


@contextmanager
def progress_reporter() -> Iterator:
    """``update(phase, done, total)`` of a bar drawn for the block (None where none can
    be seen), stopped however the block ends."""
    bar = progress_bar()
    try:
        yield bar.update if bar else None
    finally:
        if bar:
            bar.stop()
