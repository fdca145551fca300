"""Writing a file so that a reader never sees half of it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: an
    interrupted write leaves the old file (or none), never a partial one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        # mkstemp creates the file owner-only; give it the mode a plain open() would (the
        # umask's), or keep the mode of the file it replaces.
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.exists() else _default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
