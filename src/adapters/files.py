"""Writing a file so that a reader never sees half of it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def is_stream(path: Path) -> bool:
    """``path`` exists and is neither a regular file nor a folder: a pipe (``>(gzip …)``),
    a terminal, ``/dev/null``, ``/dev/stdout``. Such a path is written into; renaming a
    file over it would replace the device or pipe itself (as root, ``/dev/null``)."""
    try:
        mode = os.stat(path).st_mode  # through symlinks: /dev/stdout names a pipe or a tty
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_into(path: Path, text: str) -> None:
    """Write ``text`` into a stream (``is_stream``): there is no file to keep whole."""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)


def replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: an
    interrupted write leaves the old file (or none), never a partial one. Through a
    symlink the file it names is replaced and the link stays, as ``open()`` would write."""
    tmp, target = stage(path, text)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def stage(path: Path, text: str) -> tuple[Path, Path]:
    """``text`` in a temporary file beside ``path``, ready to be renamed over it: (the
    temporary file, the file it replaces — through a symlink, the file the link names).
    Callers that write several files stage them all before renaming any."""
    path = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        # mkstemp creates the file owner-only; give it the mode a plain open() would (the
        # umask's), or keep the mode of the file it replaces.
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.exists() else _default_mode())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp), path


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
