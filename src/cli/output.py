"""Output helpers: rich tables for people, JSON for scripts.

Results go to stdout, diagnostics and progress to stderr; the CLI is the only
layer that prints.
"""

from __future__ import annotations

import io
import json
import os
import select
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from ndplan.adapters.files import is_stream, replace_atomically, write_into
from ndplan.core.errors import InvalidInputError

from . import interrupts

# Piped tables (`ndplan devices | grep h100`) must not be squeezed into rich's default
# 80 columns, which truncates ids; a terminal (or $COLUMNS) still sets the width.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200


class OutputClosed(Exception):
    """The reader of stdout left early (`ndplan devices | head -3`): not an error, so the
    CLI stops writing and exits 0 (``cli.app.run``). Rich's and click's own handlers of
    a closed pipe exit 1, ndplan's code for "no feasible plan"; not an OSError, so
    click lets it through."""


class StdoutFailed(InvalidInputError):
    """stdout cannot take the result (a full disk, a terminal that went away): one line
    and exit 3, as for a result file that cannot be written; it is not ndplan's bug, so
    not the internal error (exit 5) an OSError would otherwise be."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(f"standard output: cannot write to it ({exc.strerror or exc})")


class _Stdout:
    """``sys.stdout`` as the result's writers see it (rich's console and ``write_stdout``):
    a failed write or flush is ``StdoutFailed``, except a closed pipe, which each writer
    turns into ``OutputClosed``. Looked up on every call, so a replaced stdout (tests)
    is the one written."""

    def write(self, text: str) -> int:
        return self._guarded(lambda: sys.stdout.write(text))

    def flush(self) -> None:
        self._guarded(sys.stdout.flush)

    @staticmethod
    def _guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutFailed(exc) from None

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: stdout's own
        return getattr(sys.stdout, name)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise OutputClosed


_stdout = _Stdout()
stdout = _Console(file=_stdout, highlight=False, soft_wrap=False, width=_PIPE_WIDTH)  # type: ignore[arg-type]
stderr = _Console(stderr=True, highlight=False)


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    return obj


def dumps(obj: Any) -> str:
    """Deterministic JSON (keys in model order, two-space indent, trailing newline)."""
    return json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False) + "\n"


def print_json(obj: Any) -> None:
    write_stdout(dumps(obj))


def write_stdout(text: str) -> None:
    interrupts.check()
    try:
        _stdout.write(text)
        _stdout.flush()
    except BrokenPipeError:
        raise OutputClosed from None


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stdout (tests) has no fd
        return False
    if not hasattr(select, "poll"):  # Windows
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked: poll still reports POLLERR and POLLHUP
    return any(events & select.POLLERR for _, events in poller.poll(0))


def drop_unwritten_stdout() -> None:
    """Forget what the console could not write (``StdoutFailed``), so that a later
    command in this process (a test, a library caller's ``run``) does not print it first."""
    was_quiet, stdout.quiet = stdout.quiet, True
    stdout.print(end="")  # a quiet console empties its buffer instead of writing it
    stdout.quiet = was_quiet


def table(
    title: str | None, columns: Sequence[str | tuple[str, str]], rows: Iterable[Sequence[Any]]
) -> Table:
    """A table; a column given as (name, 'right') is right-aligned. The table is at least as
    wide as its title, so a narrow one (one pipeline stage) does not wrap the title."""
    t = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        pad_edge=False,
        min_width=cell_len(title) if title else None,
    )
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    for k, col in enumerate(columns):
        name, justify = (col, "left") if isinstance(col, str) else col
        # Right-aligned columns hold numbers: on a narrow terminal the text columns wrap
        # first, rather than a step time cut to "5…". A number with a note ("79.9 (s1)")
        # may break at its space.
        whole = justify == "right" and not any(" " in row[k] for row in cells)
        t.add_column(name, justify=justify, no_wrap=whole)  # type: ignore[arg-type]
    for row in cells:
        t.add_row(*row)
    return t


TEXT_COLUMN_MIN = 18
"""Columns of words (recompute, time shares) wrap, but below this many cells they become
a tower of fragments."""


def fitted_table(
    title: str | None,
    columns: Sequence[str | tuple[str, str]],
    rows: Sequence[Sequence[Any]],
    droppable: Sequence[str],
    width: int,
) -> tuple[Table, list[str]]:
    """``table`` within ``width``: the ``droppable`` columns, in order, then columns with
    nothing in them, are left out until every number shows whole and the text columns keep
    ``TEXT_COLUMN_MIN`` cells; also the names of those left out."""
    names = [c if isinstance(c, str) else c[0] for c in columns]
    empty = [n for k, n in enumerate(names) if all(r[k] in ("", None) for r in rows)]
    dropped: list[str] = []
    keep = list(range(len(names)))
    for name in (*droppable, *(n for n in empty if n not in droppable)):
        if (
            _readable_width([columns[k] for k in keep], [[r[k] for k in keep] for r in rows])
            <= width
        ):
            break
        dropped.append(name)
        keep = [k for k, n in enumerate(names) if n not in dropped]
    return table(title, [columns[k] for k in keep], [[r[k] for k in keep] for r in rows]), dropped


def _readable_width(columns: Sequence[str | tuple[str, str]], rows: Sequence[Sequence[Any]]) -> int:
    """The width a table needs to show every number whole and its text columns at no
    less than ``TEXT_COLUMN_MIN`` cells: measured by rendering it so, unconstrained."""
    probe = table(None, columns, rows)
    for col in probe.columns:
        if col.justify != "right":
            col.max_width = TEXT_COLUMN_MIN
    console = Console(file=io.StringIO(), width=10_000, highlight=False)
    console.print(probe)
    return max(cell_len(line) for line in console.file.getvalue().splitlines())


_verbosity = 0


def set_verbosity(level: int) -> None:
    """``-v`` minus ``-q`` from the root command: below 0 silences notes, below −1 warnings."""
    global _verbosity
    _verbosity = level


def quiet() -> bool:
    return _verbosity < 0


def note(message: str, *, warning: bool = False) -> None:
    """A diagnostic line on stderr: ``-q`` drops notes (assumptions, progress of a fit),
    ``-qq`` warnings too; errors are never dropped (they do not come through here)."""
    if _verbosity >= (-1 if warning else 0):
        stderr.print(message, markup=False, soft_wrap=True)


def check_output_file(path: Path, flag: str, *, force: bool) -> None:
    """Before any work: ``path`` can be written — not a folder, not an existing file
    without ``force``, and its folder exists or can be made where something writable is."""
    if str(path) == "-":  # not stdout here: the result goes there already (or --json)
        raise InvalidInputError(f"{flag} -: give a file path (the result is on stdout)")
    if path.is_dir():
        raise InvalidInputError(f"{flag} {path}: is a folder; give a file path")
    if is_stream(path):  # /dev/stdout, a pipe: written into, so nothing to overwrite
        if not os.access(path, os.W_OK):
            raise InvalidInputError(f"{flag} {path}: cannot write to it; give another path")
        return
    if path.exists() and not force:
        raise InvalidInputError(f"{flag} {path}: exists; pass --force to overwrite it")
    check_writable_folder(path.parent, flag, path)


def check_writable_folder(folder: Path, flag: str, given: Path) -> None:
    """``folder`` is, or can be created as, a folder this process may write in."""
    ancestor = folder.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidInputError(f"{flag} {given}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{flag} {given}: cannot write in {ancestor}; give another path")


def write_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename; never clobber without
    ``force``. A stream (a pipe, ``/dev/stdout``) is written into instead."""
    interrupts.check()  # Ctrl-C means no result file, even one a C callback swallowed
    stream = is_stream(path)
    if path.exists() and not stream and not force:
        raise InvalidInputError(f"{path}: exists; pass --force to overwrite it")
    try:
        if stream:
            write_into(path, text)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(path, text)
    except OSError as exc:  # checked up front; a disk that fills or a folder that vanishes
        raise InvalidInputError(f"{path}: cannot write it ({exc.strerror or exc})") from None


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f}"
