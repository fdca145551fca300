"""Ctrl-C during ``ndplan search`` (issue 7, spec/interfaces.md): exit 130 with one
line, and no partial output — no ``--ranking-csv``, nothing in ``--debug-dir``, no
temporary files, and an existing ranking file (``--force``) left as it was.

The signal is sent ~1.5 s after pricing starts. A Ctrl-C that lands while numba compiles
a kernel (a fresh clone's cold cache) is raised inside llvmlite's ctypes callback, where
Python drops it; the CLI records the signal and stops all the same (``cli.interrupts``),
which the last test pins with a plugin that drops one on purpose. A Ctrl-C inside a
compiled kernel surfaces as a SystemError caused by the interrupt, which the CLI maps to
130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import cli_env, default_sigint

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"

MAIN = "from ndplan.cli.app import main; main()"
# An unpruned search that prices for ~10 s in one process (interrupted after ~1.5 s).
LONG = [
    *("search", "-m", "mixtral-8x7b", "-d", "h100", "-n", "32", "--gbs", "64", "-s", "4096"),
    *("--exhaustive", "-j", "1", "--json"),
]


def interrupt(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NDPLAN_NO_PROGRESS": "1"}
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        env.pop(var, None)
    debug = tmp_path / "debug"
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, *LONG, "--debug-dir", str(debug), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )
    try:
        # The debug folder is made just before pricing starts: then the search is running.
        deadline = time.monotonic() + 60
        while not debug.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.5)  # past the kernels' JIT warm-up (see below)
        assert proc.poll() is None, "the search ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def no_temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_ctrl_c_exits_130_and_leaves_no_partial_files(tmp_path: Path) -> None:
    ranking = tmp_path / "ranking.csv"
    done = interrupt(tmp_path, "--ranking-csv", str(ranking))
    assert done.returncode == 130, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == ["ndplan: error: interrupted"]
    assert not ranking.exists()
    assert not [p for p in (tmp_path / "debug").rglob("*")], "a debug file was written"
    assert not no_temporaries(tmp_path)


@pytest.mark.slow
def test_ctrl_c_leaves_an_existing_ranking_file_as_it_was(tmp_path: Path) -> None:
    ranking = tmp_path / "ranking.csv"
    ranking.write_text("an earlier ranking\n", encoding="utf-8")
    done = interrupt(tmp_path, "--ranking-csv", str(ranking), "--force")
    assert done.returncode == 130, done.stderr
    assert ranking.read_text(encoding="utf-8") == "an earlier ranking\n"
    assert not no_temporaries(tmp_path)


def test_ctrl_c_that_python_drops_still_stops_the_search(tmp_path: Path) -> None:
    """Fix: a Ctrl-C raised inside a C callback (llvmlite's, while numba compiles) was
    dropped, and the search ran on to exit 0 and wrote its files (a fresh clone's CI run
    failed the test above this way). The plugin drops one on purpose during enumeration:
    the command still exits 130, with one line and no file."""
    ranking = tmp_path / "ranking.csv"
    debug = tmp_path / "debug"
    done = subprocess.run(
        [
            *(sys.executable, "-c", MAIN, "-p", "swallowed_interrupt", *LONG[:11], "-j", "1"),
            *("--ranking-csv", str(ranking), "--debug-dir", str(debug)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**cli_env(), "PYTHONPATH": str(PLUGINS)},
        preexec_fn=default_sigint,
    )
    assert done.returncode == 130, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == ["ndplan: error: interrupted"]
    assert not ranking.exists()
    assert not [p for p in debug.rglob("*")], "a debug file was written"
    assert not no_temporaries(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.15, 0.3])
def test_ctrl_c_while_the_cli_starts_up_is_one_line_and_130(after_s: float) -> None:
    """The imports take about half a second; a Ctrl-C among them was an import traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from ndplan.cli.launch import main; main()", *LONG],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
        preexec_fn=default_sigint,
    )
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert out == b"" and err.decode().strip() == "ndplan: error: interrupted", err
