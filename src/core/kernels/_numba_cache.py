"""Where numba keeps the compiled kernels: a writable folder, whatever the install.

``@njit(cache=True)`` writes next to the source (``__pycache__``) by default. A
system install, a read-only clone or a Nix-style store has no writable source
folder; rather than failing (or recompiling on every run) the kernels are then
cached under the user's cache folder: ``$XDG_CACHE_HOME/ndplan/numba``, else
``~/.cache/ndplan/numba``, else a per-user folder under the temp dir.

A user's ``NUMBA_CACHE_DIR`` always wins. This module does not import numba; the
kernel module calls :func:`configure_numba_cache` just before it does, and if
numba was already imported the setting is also written to ``numba.config``.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

__all__ = ["configure_numba_cache", "source_folder_is_writable", "user_cache_folder"]

_KERNEL_FOLDER = Path(__file__).resolve().parent


def source_folder_is_writable(folder: Path) -> bool:
    """True when numba can keep its cache in ``folder/__pycache__``.

    ``os.access`` answers "yes" to root whatever the mode, so a folder whose
    mode grants nobody write access (``chmod a-w``: a deliberately read-only
    install) also counts as read-only.
    """
    target = folder / "__pycache__"
    if not target.is_dir():
        target = folder
    try:
        mode = target.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(
        target, os.W_OK | os.X_OK
    )


def user_cache_folder() -> Path:
    """``$XDG_CACHE_HOME/ndplan/numba``, else ``~/.cache/ndplan/numba``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "ndplan" / "numba"


def _usable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def configure_numba_cache(source_folder: Path = _KERNEL_FOLDER) -> str | None:
    """Point numba's cache at a user folder when ``source_folder`` (the kernels') is read-only.

    Returns the cache folder chosen, or None when nothing was changed (the user
    set ``NUMBA_CACHE_DIR``, or the in-tree ``__pycache__`` is writable).
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    if source_folder_is_writable(source_folder):
        return None
    candidates = [user_cache_folder()]
    uid = os.getuid() if hasattr(os, "getuid") else os.getpid()
    candidates.append(Path(tempfile.gettempdir()) / f"ndplan-{uid}" / "numba")
    for folder in candidates:
        if _usable(folder):
            chosen = str(folder)
            break
    else:
        return None  # numba falls back to its own locators (and may not cache)
    os.environ["NUMBA_CACHE_DIR"] = chosen
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        # numba was imported before us: its config has already read the
        # environment. The env var above keeps a later reload consistent.
        numba_config.CACHE_DIR = chosen
    return chosen
