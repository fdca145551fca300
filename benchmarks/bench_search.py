"""Search speed: whole-process wall time of `ndplan search` on three real-scale problems.

Each scenario runs as a fresh process (imports, plugin loading, model and device
parsing included) pinned to one core, with a warm numba cache; the median of
several runs is reported beside the search phase alone (from the result's own
``summary.seconds``). The payoff of reuse and bounding is measured in the same run
by turning each off.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "benchmarks.md"
NDPLAN = [str(Path(sys.executable).with_name("ndplan"))]

SCENARIOS = {
    "a": (
        "Llama-3-70B, 1,024 × H100, GBS 1,024, seq 8,192, every dimension incl. per-layer recompute",
        ["-m", "llama-3-70b", "-d", "h100-sxm", "-n", "1024", "--gbs", "1024", "-s", "8192"],
        3.0,
    ),
    "b": (
        "DeepSeek-V3, 2,048 × H800, GBS 15,360, seq 4,096, with EP",
        ["-m", "deepseek-v3", "-d", "h800", "-n", "2048", "--gbs", "15360", "-s", "4096"],
        20.0,
    ),
    "c": (
        "Llama-3.1-405B, 16,384 × H100, GBS 2,048, seq 8,192",
        ["-m", "llama-3.1-405b", "-d", "h100-sxm", "-n", "16384", "--gbs", "2048", "-s", "8192"],
        10.0,
    ),
}
ABLATION = (
    "the demo problem: Llama-3-70B, 64 × H100, GBS 512, seq 8,192",
    ["-m", "llama-3-70b", "-d", "h100-sxm", "-n", "64", "--gbs", "512", "-s", "8192"],
)


def _run(args: list[str], extra: list[str] = ()) -> tuple[float, dict]:
    cmd = [*NDPLAN, "search", *args, "--json", "-j", "1", *extra]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    env = {**os.environ, "NDPLAN_NO_PROGRESS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - start
    return wall, json.loads(done.stdout)


def measure(args: list[str], runs: int, extra: list[str] = ()) -> dict:
    _run(args, extra)  # warm the numba cache and the OS file cache
    walls, searches, summary = [], [], {}
    for _ in range(runs):
        wall, result = _run(args, extra)
        walls.append(wall)
        summary = result["summary"]
        searches.append(summary["seconds"]["total"])
    return {
        "wall_s": statistics.median(walls),
        "search_s": statistics.median(searches),
        "generated": summary["generated"],
        "priced": summary["priced"],
        "bounded": summary["bounded"],
        "over_memory": summary["over_memory"],
    }


def main(runs: int = 3) -> dict:
    figures: dict = {}
    for key, (_, args, target) in SCENARIOS.items():
        m = measure(args, runs)
        figures[key] = {**m, "target_s": target}
        print(
            f"search ({key}): {m['wall_s']:.2f} s whole process, {m['search_s']:.2f} s search "
            f"(target ≤ {target:g} s)"
        )
    _, args = ABLATION
    full = measure(args, runs)
    no_bound = measure(args, runs, ["--exhaustive"])
    no_memo = measure(args, 1, ["--no-memo"])
    figures["ablation"] = {"both": full, "no_bounding": no_bound, "no_reuse": no_memo}
    print(
        f"ablation: bounding ×{no_bound['search_s'] / full['search_s']:.1f}, "
        f"reuse ×{no_memo['search_s'] / full['search_s']:.1f}"
    )
    return figures


def markdown(figures: dict) -> str:
    rows = []
    for key, (title, _, target) in SCENARIOS.items():
        m = figures[key]
        rows.append(
            f"| ({key}) {title} | {m['wall_s']:.2f} | {m['search_s']:.2f} | ≤ {target:g} | "
            f"{m['generated']:,} | {m['over_memory']:,} | {m['bounded']:,} | {m['priced']:,} |"
        )
    full, no_bound, no_memo = (figures["ablation"][k] for k in ("both", "no_bounding", "no_reuse"))
    return "\n".join(
        [
            "## Search speed",
            "",
            "Wall times are the median of several runs of a fresh `ndplan search --json -j 1` process pinned to one "
            "core (imports, plugin loading and input parsing included; numba cache warm and the package "
            "byte-compiled, as `make install` leaves them); *search* is the search "
            "phase alone as the result reports it (`summary.seconds.total`).",
            "",
            "| scenario | whole process s | search s | target s | generated | over memory | bounded | priced |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "### What reuse and bounding buy",
            "",
            f"On {ABLATION[0]}, search phase: both on {full['search_s']:.2f} s; bounding off (`--exhaustive`) "
            f"{no_bound['search_s']:.2f} s (×{no_bound['search_s'] / full['search_s']:.1f}); reuse off "
            f"(`--no-memo`, one run) {no_memo['search_s']:.2f} s (×{no_memo['search_s'] / full['search_s']:.1f}). "
            f"Candidates priced exactly: {full['priced']:,} with bounding, {no_bound['priced']:,} without.",
            "",
        ]
    )


if __name__ == "__main__":
    print(markdown(main()))
