"""Shared fixtures: an installed wheel in a fresh venv (for install-level checks)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from hypothesis import settings

# The suite is reproducible: the property tests draw the same examples on every run, so
# CI cannot pass or fail by chance. `make fuzz` draws fresh random ones (the
# `explore` profile); that is where new counterexamples are found.
settings.register_profile("reproducible", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile("reproducible")

# The suite checks what a pipe gets. These make rich treat any output as a terminal
# (progress bars on stderr, colour codes in the tables), and some CI runners export them.
for _name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
    os.environ.pop(_name, None)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers set COLUMNS=80 and LINES=24; the CLI takes COLUMNS as a
    # terminal's width. The suite checks what a pipe gets, as a serial run sees it.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

REPO = Path(__file__).resolve().parents[1]
# Copies of the published measurements and Megatron-LM's reference vectors, so the
# suite runs from a clean clone with nothing beside it.
SHARED_DATA = REPO / "tests" / "data" / "shared"


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the project's wheel once per session (editable installs hide missing files)."""
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of what the wheel is made of: setuptools writes build/ and
    # *.egg-info beside the sources, and under `make test` each pytest worker may build.
    project = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, project / name)
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__"))
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    subprocess.run([*pip_wheel, "-w", str(out), str(project)], check=True)
    (wheel,) = out.glob("ndplan-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheel_venv(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel and its runtime dependencies; returns its bin dir."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(built_wheel)],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return bin_dir
