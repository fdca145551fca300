"""The progress bars of search, compare and sweep: on stderr when stderr is a terminal,
whatever stdout is."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

from cli_runs import DEMO, cli_env, ndplan
from rich.console import Console

from ndplan.cli.progress import ProgressBar, WholeElapsed


def _search_with_terminal_stderr(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    return _with_terminal_stderr("search", *args)


def _with_terminal_stderr(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    """`ndplan …` with stderr on a pseudo-terminal and stdout on a pipe (as in
    `ndplan search … --json > plan.json` typed at a terminal); what reached the terminal."""
    env = cli_env()
    del env["NDPLAN_NO_PROGRESS"]
    # The terminal a user types at. A runner's own TERM may be "dumb" (some CI runners),
    # on which rich rightly draws no bar: it cannot redraw a line there.
    env["TERM"] = "xterm-256color"
    master, slave = pty.openpty()
    received: list[bytes] = []

    def drain() -> None:  # a full terminal buffer would block the child's writes
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the child's end is closed
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "from ndplan.cli.app import main; main()", *args],
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            timeout=300,
        )
    finally:
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    return proc, b"".join(received).decode("utf-8", "replace")


def test_the_progress_bar_draws_on_a_terminal_when_stdout_is_redirected():
    proc, terminal = _search_with_terminal_stderr(*DEMO, "-t", "3", "--json")
    assert proc.returncode == 0, terminal
    # The bar's frames (phase, bar, candidates examined of all) went to the terminal …
    assert "price" in terminal and "━" in terminal, terminal
    # … and stdout holds the JSON alone.
    result = json.loads(proc.stdout)
    summary = result["summary"]
    examined = {int(total) for total in re.findall(r"price\S*\s.*?\d+/(\d+)", terminal)}
    assert examined == {summary["generated"] - sum(summary["refused"].values())}, terminal
    assert [plan["rank"] for plan in result["plans"]] == [1, 2, 3]


def test_each_phase_refills_the_bar_and_the_clock_counts_the_whole_search():
    """A phase that fills the bar (bound: every candidate) marked the task finished, so
    the next phase's bar was drawn as done and its clock stood still; each phase now
    refills it, and the elapsed time is the search's since the bar was made."""
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    bar = ProgressBar(console)
    bar.update("enumerate", 0, 36)
    bar.update("enumerate", 35, 36)
    bar.update("bound", 32768, 33890)
    bar.update("bound", 33890, 33890)
    (task,) = bar.bar.tasks
    assert task.finished
    bar.update("price", 2118, 33890)
    (task,) = bar.bar.tasks
    assert (task.description, task.completed, task.total) == ("price", 2118, 33890)
    assert not task.finished
    clock = next(c for c in bar.bar.columns if isinstance(c, WholeElapsed))
    clock.started -= 65  # as if the search had started 65 s ago
    assert clock.render(task).plain == "0:01:05"
    bar.stop()


def _frames(terminal: str, phase: str) -> list[tuple[int, int]]:
    """The (done, total) of each frame of ``phase`` the terminal received."""
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", terminal)
    return [(int(d), int(t)) for d, t in re.findall(phase + r"\S*\s.*?(\d+)/(\d+)", plain)]


def test_compare_draws_a_bar_over_the_rows_and_prints_the_same(tmp_path):
    runs = Path(__file__).resolve().parents[1] / "data" / "shared" / "measured_runs.csv"
    proc, terminal = _with_terminal_stderr("compare", str(runs), "--rows", "odd", "--json")
    assert proc.returncode == 0, terminal
    frames = _frames(terminal, "compare")
    (total,) = {t for _, t in frames}
    assert frames[-1] == (total, total) and len(frames) > 1, terminal
    assert [d for d, _ in frames] == sorted(d for d, _ in frames)
    quiet = ndplan("compare", str(runs), "--rows", "odd", "--json")
    assert quiet.returncode == 0 and json.loads(proc.stdout) == json.loads(quiet.stdout)


def test_sweep_draws_a_bar_that_moves_scenario_by_scenario_and_prints_the_same(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "model: llama-3-8b\ndevice: h100-sxm\ndevices: [8, 16, 32]\ngbs: 64\nseq_len: 2048\n",
        encoding="utf-8",
    )
    proc, terminal = _with_terminal_stderr("sweep", str(sweep), "--json", "-j", "1")
    assert proc.returncode == 0, terminal
    assert sorted(set(_frames(terminal, "sweep"))) == [(1, 3), (2, 3), (3, 3)], terminal
    quiet = ndplan("sweep", str(sweep), "--json", "-j", "1")
    assert quiet.returncode == 0 and json.loads(proc.stdout) == json.loads(quiet.stdout)
