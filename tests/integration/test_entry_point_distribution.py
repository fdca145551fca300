"""A real third-party distribution, pip-installed, plugs a device in through the `ndplan` entry point.

The distribution is written into a temporary folder, built and installed with pip
into the session's wheel venv (never the development venv), and uninstalled
afterwards so other tests see the venv as the wheel left it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

GOOD_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "ndplan-testdev"
version = "0.1.0"
description = "A device plugin for ndplan's tests"

[project.entry-points.ndplan]
mydevices = "ndplan_testdev"

[tool.setuptools]
py-modules = ["ndplan_testdev"]
"""

GOOD_MODULE = '''\
"""A third-party device plugin."""

from ndplan.core.cluster import DeviceSpec
from ndplan.plugins.hookspecs import hookimpl


@hookimpl
def ndplan_register_devices(registry):
    spec = DeviceSpec(
        id="test-accel-9000",
        name="Test Accelerator 9000",
        vendor="ndplan-tests",
        aliases=("TA-9000",),
        memory_gib=42,
        peak_tflops={"bf16": 123.0},
        hbm_bandwidth_gb_per_s=1000,
        scale_up={"bandwidth_gb_per_s": 100, "domain_size": 4},
        scale_out={"bandwidth_gb_per_s": 12.5},
        host_link={"bandwidth_gb_per_s": 32},
    )
    registry.add(spec.id, spec, aliases=spec.aliases)
'''

# An entry point naming an attribute its module does not have: it installs fine and
# fails when ndplan loads it.
BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "ndplan-testbroken"
version = "0.2.0"

[project.entry-points.ndplan]
brokenplug = "ndplan_testbroken:no_such_plugin"

[tool.setuptools]
py-modules = ["ndplan_testbroken"]
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith(("NDPLAN_", "VIRTUAL_ENV"))
    }
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def pip(bin_dir: Path, *args: str) -> None:
    result = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "--quiet", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def write_distribution(folder: Path, pyproject: str, module: str, source: str) -> Path:
    folder.mkdir()
    (folder / "pyproject.toml").write_text(pyproject)
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    return folder


def ndplan(bin_dir: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "ndplan"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(**env),
        timeout=120,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def testdev(wheel_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel venv with ``ndplan-testdev`` installed; its bin dir."""
    root = tmp_path_factory.mktemp("testdev")
    dist = write_distribution(
        root / "ndplan-testdev", GOOD_PYPROJECT, "ndplan_testdev", GOOD_MODULE
    )
    pip(wheel_venv, "install", "--no-deps", str(dist))
    try:
        yield wheel_venv
    finally:
        pip(wheel_venv, "uninstall", "--yes", "ndplan-testdev")


def test_the_device_shows_up_in_ndplan_devices(testdev: Path, tmp_path: Path) -> None:
    devices = json.loads(ok(ndplan(testdev, "devices", "--json", cwd=tmp_path)))
    rows = {d["id"]: d for d in devices}

    mine = rows["test-accel-9000"]
    assert mine["registered_by"] == "mydevices"
    assert mine["memory_gib"] == 42
    assert mine["aliases"] == ["TA-9000"]
    assert mine["replaced"] is None
    assert rows["h100-sxm"]["registered_by"] == "ndplan.builtin"

    table = ok(ndplan(testdev, "devices", cwd=tmp_path))
    (line,) = [ln for ln in table.splitlines() if "test-accel-9000" in ln]
    assert "mydevices" in line


def test_the_plugin_shows_up_in_ndplan_plugins_with_its_entry_point(
    testdev: Path, tmp_path: Path
) -> None:
    listing = json.loads(ok(ndplan(testdev, "plugins", "--json", cwd=tmp_path)))
    assert [p["name"] for p in listing] == ["ndplan.builtin", "mydevices"]

    mine = listing[1]
    assert re.fullmatch(r"entry point ndplan[-_]testdev 0\.1\.0 \(ndplan_testdev\)", mine["source"])
    assert mine["hooks"] == ["ndplan_register_devices"]


def test_ndplan_disable_plugins_hides_it(testdev: Path, tmp_path: Path) -> None:
    env = {"NDPLAN_DISABLE_PLUGINS": "mydevices"}
    devices = json.loads(ok(ndplan(testdev, "devices", "--json", cwd=tmp_path, **env)))
    plugins = json.loads(ok(ndplan(testdev, "plugins", "--json", cwd=tmp_path, **env)))

    assert "test-accel-9000" not in {d["id"] for d in devices}
    assert "h100-sxm" in {d["id"] for d in devices}
    assert [p["name"] for p in plugins] == ["ndplan.builtin"]


def test_a_broken_installed_plugin_exits_4_naming_it(testdev: Path, tmp_path: Path) -> None:
    dist = write_distribution(
        tmp_path / "ndplan-testbroken", BROKEN_PYPROJECT, "ndplan_testbroken", '"""Empty."""\n'
    )
    pip(testdev, "install", "--no-deps", str(dist))
    try:
        broken = ndplan(testdev, "devices", cwd=tmp_path)
        assert broken.returncode == 4
        assert broken.stdout == ""
        (line,) = broken.stderr.splitlines()
        assert line.startswith(
            "ndplan: error: plugin 'brokenplug' (ndplan_testbroken:no_such_plugin) failed to load"
        )
        assert "AttributeError" in line

        # Blocking it by name lets the run go on, with the good plugin still loaded.
        healed = ndplan(
            testdev, "devices", "--json", cwd=tmp_path, NDPLAN_DISABLE_PLUGINS="brokenplug"
        )
        assert "test-accel-9000" in {d["id"] for d in json.loads(ok(healed))}
    finally:
        pip(testdev, "uninstall", "--yes", "ndplan-testbroken")
