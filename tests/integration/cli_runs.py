"""Running the CLI in a fresh interpreter, for the executor tests: a clean environment and
a search's outputs (JSON, ranking CSV, debug files) as bytes, to compare executors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

DEMO = ["-m", "llama-3-70b", "-d", "h100", "-n", "64", "--gbs", "512", "-s", "8192"]
MOE = ["-m", "mixtral-8x7b", "-d", "h100", "-n", "64", "--gbs", "512", "-s", "4096"]
SMALL = ["-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "32", "-s", "4096"]
"""Small enough to rank every plan that fits (--ranking-csv) in a few seconds."""


def default_sigint() -> None:
    """``preexec_fn`` for a CLI that a test interrupts: a child of a shell without job
    control (``nohup … &``, some CI runners) inherits SIGINT ignored, and Python then
    never installs its KeyboardInterrupt handler. Ctrl-C in a terminal has the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_env(**extra: str) -> dict[str, str]:
    """This environment without the NDPLAN_ settings a developer may have exported."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NDPLAN_PLUGINS", "NDPLAN_JOBS", "NDPLAN_DEBUG", "NDPLAN_DISABLE_PLUGINS")
    }
    env.update(NDPLAN_NO_PROGRESS="1", COLUMNS="200", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def ndplan(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter (so workers really start before inputs are parsed)."""
    return subprocess.run(
        [sys.executable, "-c", "from ndplan.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        env=cli_env(**env),
        timeout=300,
    )


def search_outputs(
    tmp: Path, problem: list[str], *executor: str, ranking: bool = False
) -> dict[str, object]:
    """A search's --json (without wall times) and --debug-dir files, as bytes; with
    ``ranking``, its --ranking-csv too (which prices every plan that fits: no bounding,
    so without it the bounded search's own records are compared)."""
    tmp.mkdir(parents=True)
    csv = ("--ranking-csv", str(tmp / "ranking.csv")) if ranking else ()
    proc = ndplan("search", *problem, *executor, "--json", *csv, "--debug-dir", str(tmp / "debug"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout is exactly the JSON: no worker or Ray log lines
    assert proc.stdout == json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    result["summary"].pop("seconds")
    out: dict[str, object] = {"json": result}
    if ranking:
        out["ranking.csv"] = (tmp / "ranking.csv").read_bytes()
    for path in sorted((tmp / "debug").iterdir()):
        out[f"debug/{path.name}"] = path.read_bytes()
    return out
