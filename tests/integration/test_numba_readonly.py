"""An installed, read-only ndplan still caches its numba kernels: in the user's cache folder.

``@njit(cache=True)`` writes next to the source by default. When the package
folder is read-only (a system install, a read-only clone), ndplan points numba
at ``$XDG_CACHE_HOME/ndplan/numba`` (else ``~/.cache/ndplan/numba``) instead of
failing. Checked on a wheel installed in a fresh venv, with the package folder
made read-only (``chmod a-w``; the check treats that as read-only even for
root, whom ``os.access`` would let write).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ndplan.core.kernels.knapsack import LayerGroup, LayerOption, choose

pytestmark = pytest.mark.slow

MiB = 2**20

# A stage whose fastest options do not fit: the DP (and so numba) must run.
SCRIPT = """
import json, sys
from ndplan.core.kernels import knapsack as k
assert "numba" not in sys.modules
opts = (
    k.LayerOption("none", 8 * 2**20, 0.25, 0.75),
    k.LayerOption("attn", 5 * 2**20, 0.25, 1.0),
    k.LayerOption("full", 2 * 2**20, 0.25, 1.75),
)
c = k.choose([k.LayerGroup("dense", opts, 3, 1)], 21 * 2**20)
print(json.dumps({
    "engine": k.engine_name(),
    "numba_imported": "numba" in sys.modules,
    "counts": c.groups[0].counts,
    "memory": c.memory_bytes,
    "time": c.time_s,
}))
"""


def _package_dir(bin_dir: Path) -> Path:
    out = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import ndplan, os; print(os.path.dirname(ndplan.__file__))",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    )
    return Path(out.stdout.strip())


@pytest.fixture
def read_only_package(wheel_venv: Path) -> Iterator[Path]:
    """The installed package with every write bit cleared; restored afterwards."""
    root = _package_dir(wheel_venv)
    modes: dict[Path, int] = {}
    paths = [root, *root.rglob("*")]
    for path in paths:
        modes[path] = stat.S_IMODE(path.lstat().st_mode)
    # Files first, then folders deepest first, so the walk is not locked out.
    for path in sorted(paths, key=lambda p: (p.is_dir(), -len(p.parts))):
        path.chmod(modes[path] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield root
    finally:
        for path in sorted(paths, key=lambda p: len(p.parts)):
            path.chmod(modes[path])


def _run(bin_dir: Path, home: Path, xdg: Path | None) -> dict:
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            "NUMBA_CACHE_DIR",
            "NDPLAN_ENGINE",
            "NUMBA_DISABLE_JIT",
            "PYTHONPATH",
            "XDG_CACHE_HOME",
        }
    }
    env["HOME"] = str(home)
    if xdg is not None:
        env["XDG_CACHE_HOME"] = str(xdg)
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", SCRIPT],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(home),
    )
    return json.loads(out.stdout)


def _expected() -> dict:
    opts = (
        LayerOption("none", 8 * MiB, 0.25, 0.75),
        LayerOption("attn", 5 * MiB, 0.25, 1.0),
        LayerOption("full", 2 * MiB, 0.25, 1.75),
    )
    c = choose([LayerGroup("dense", opts, 3, 1)], 21 * MiB, engine="python")
    assert c is not None
    return {
        "counts": [list(pair) for pair in c.groups[0].counts],
        "memory": c.memory_bytes,
        "time": c.time_s,
    }


def _cache_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in {".nbi", ".nbc"}]


@pytest.mark.parametrize("with_xdg", [True, False], ids=["xdg-cache-home", "home-cache"])
def test_read_only_install_caches_in_the_user_folder(
    read_only_package: Path, wheel_venv: Path, tmp_path: Path, with_xdg: bool
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    xdg = tmp_path / "xdg" if with_xdg else None
    cache = (xdg if xdg is not None else home / ".cache") / "ndplan" / "numba"

    result = _run(wheel_venv, home, xdg)

    assert result["engine"] == "numba"
    assert result["numba_imported"]
    assert {k: result[k] for k in ("counts", "memory", "time")} == _expected()
    files = _cache_files(cache)
    assert {p.suffix for p in files} == {".nbi", ".nbc"}, f"no numba cache under {cache}"
    assert _cache_files(read_only_package) == []
    # A second run loads the kernels from that cache and agrees.
    assert _run(wheel_venv, home, xdg) == result
    assert sorted(_cache_files(cache)) == sorted(files)
