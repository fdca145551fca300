"""The Ray executor (spec/executors.md, "The cluster executor"): on a local instance with
two CPUs, a search and a sweep give the same output byte for byte as in one process,
and Ray's own logging stays off stdout."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from cli_runs import DEMO, MOE, SMALL, search_outputs

from ndplan.cli.app import run

ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed (pip install 'ndplan[ray]')"
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SWEEP = ["-m", "llama-3-8b", "-m", "mixtral-8x7b", "-d", "h100", "-n", "16", "-n", "64"]
SWEEP += ["--gbs", "256", "-s", "4096"]


def test_cli_search_on_a_local_ray_instance_matches_serial(tmp_path: Path) -> None:
    """The CLI starts (and stops) its own local instance; stdout is exactly the JSON."""
    serial = search_outputs(tmp_path / "serial", DEMO, "-j", "1")
    on_ray = search_outputs(tmp_path / "ray", DEMO, "--executor", "ray", "-j", "2")
    small = [search_outputs(tmp_path / f"small-{name}", SMALL, *executor, ranking=True)
             for name, executor in (("serial", ["-j", "1"]), ("ray", ["--executor", "ray"]))]  # fmt: skip
    assert small[0] == small[1] and "ranking.csv" in small[0]
    assert set(serial) == set(on_ray)
    for name in serial:
        assert on_ray[name] == serial[name], f"{name} differs between serial and ray"


@pytest.fixture(scope="module")
def local_ray():
    """One local instance for the in-process tests (the executor joins it, leaves it up)."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    yield
    ray.shutdown()


def _run_json(capfd: pytest.CaptureFixture, args: list[str]) -> dict:
    assert run(args) == 0
    out = capfd.readouterr().out
    return json.loads(out)  # nothing but the JSON on stdout


def test_moe_search_on_ray_matches_serial(local_ray, capfd, tmp_path: Path) -> None:
    outputs = {}
    for name, executor in (("serial", ["-j", "1"]), ("ray", ["--executor", "ray"])):
        folder = tmp_path / name
        result = _run_json(
            capfd,
            [
                "search",
                *MOE,
                *executor,
                "--json",
                "--debug-dir",
                str(folder / "debug"),
            ],
        )
        result["summary"].pop("seconds")
        files = {p.name: p.read_bytes() for p in sorted((folder / "debug").iterdir())}
        outputs[name] = (result, files)
    assert outputs["ray"] == outputs["serial"]
    assert ray.is_initialized()  # the executor joined the running instance and left it up


def test_sweep_on_ray_matches_serial(local_ray, capfd) -> None:
    serial = _run_json(capfd, ["sweep", *SWEEP, "-j", "1", "--json"])
    on_ray = _run_json(capfd, ["sweep", *SWEEP, "--executor", "ray", "--json"])
    assert on_ray == serial
    assert [r["status"] for r in serial["scenarios"]] == ["ok"] * 4
