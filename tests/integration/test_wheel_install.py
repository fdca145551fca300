"""`pip install` of the built wheel into a fresh venv gives a working `ndplan`.

An editable install reads the source tree, so it hides a package or a data file
missing from the wheel; these run the installed console script from a folder
outside the repository, with nothing of the repository on the path.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ndplan import __version__

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DEVICE_DATA = REPO / "src" / "adapters" / "devices" / "data"
PRESETS = REPO / "src" / "adapters" / "readers" / "presets"


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith(("NDPLAN_", "VIRTUAL_ENV"))
    }
    return {**env, **extra}


def ndplan(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "ndplan"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
        timeout=120,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_installed_package_is_not_the_source_tree(wheel_venv: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [str(wheel_venv / "python"), "-c", "import ndplan; print(ndplan.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    installed = Path(out.stdout.strip())
    assert "site-packages" in installed.parts
    assert REPO not in installed.parents


def test_version(wheel_venv: Path, tmp_path: Path) -> None:
    assert ok(ndplan(wheel_venv, "--version", cwd=tmp_path)) == f"ndplan {__version__}\n"


def test_plugins_json_lists_the_builtin(wheel_venv: Path, tmp_path: Path) -> None:
    listing = json.loads(ok(ndplan(wheel_venv, "plugins", "--json", cwd=tmp_path)))
    builtin = next(p for p in listing if p["name"] == "ndplan.builtin")
    assert builtin["source"] == "builtin"
    assert "ndplan_register_devices" in builtin["hooks"]
    assert "ndplan_register_presets" in builtin["hooks"]


def test_schema_prints_every_model(wheel_venv: Path, tmp_path: Path) -> None:
    schemas = json.loads(ok(ndplan(wheel_venv, "schema", cwd=tmp_path)))
    assert {"ModelSpec", "DeviceSpec", "Cluster", "Job", "Layout", "SearchSpace", "Plan"} <= set(
        schemas
    )
    assert schemas["Layout"]["additionalProperties"] is False

    layout = json.loads(ok(ndplan(wheel_venv, "schema", "Layout", cwd=tmp_path)))
    assert layout == schemas["Layout"]


def test_the_device_data_ships_in_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    devices = json.loads(ok(ndplan(wheel_venv, "devices", "--json", cwd=tmp_path)))
    ids = {d["id"] for d in devices}
    assert {"h100-sxm", "gb200", "mi300x"} <= ids
    shipped = {p.stem for p in DEVICE_DATA.glob("*.yaml")}
    assert ids == shipped  # every data file in the source tree made it into the wheel
    assert all(d["registered_by"] == "ndplan.builtin" for d in devices)


def test_the_model_presets_ship_in_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    code = (
        "from ndplan.bootstrap import bootstrap\n"
        "import json\n"
        "print(json.dumps(sorted(bootstrap().presets)))"
    )
    out = subprocess.run(
        [str(wheel_venv / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    presets = json.loads(out.stdout)
    assert presets == sorted(p.stem for p in PRESETS.glob("*.json"))
    assert "llama-3-8b" in presets


def test_bad_input_gives_the_documented_code_and_one_line(wheel_venv: Path, tmp_path: Path) -> None:
    unknown = ndplan(wheel_venv, "schema", "Nope", cwd=tmp_path)
    assert unknown.returncode == 3
    assert unknown.stderr.startswith("ndplan: error: unknown schema 'Nope'")
    assert len(unknown.stderr.splitlines()) == 1

    plugin = ndplan(wheel_venv, "-p", "no.such.module", "plugins", cwd=tmp_path)
    assert plugin.returncode == 4
    assert len(plugin.stderr.splitlines()) == 1
    assert "'no.such.module'" in plugin.stderr

    malformed = ndplan(wheel_venv, "devices", "--frobnicate", cwd=tmp_path)
    assert malformed.returncode == 2
    assert "No such option" in malformed.stderr
