"""Executors: what the process pool and Ray buy, and what they cost (spec/executors.md).

Run as ``python -m benchmarks.bench_executors``. Every figure is the whole-process
wall time of a fresh ``ndplan`` command (imports, worker start-up, input parsing
and shutdown included), measured in the same run:

- the pool's speed-up over serial on a search that takes tens of seconds serially
  (``--exhaustive`` on Llama-3-70B, 128 × H100, GBS 1,024, seq 8,192: every
  candidate priced, about 25 s serially; medians of three
  alternating runs), with the outputs checked identical;
- the pool's start-up overhead on a tiny search (pool minus serial, medians);
- sweep throughput (scenarios per second) of a 20-scenario ``ndplan sweep`` in one
  process, on the pool and on a local Ray instance (whose start-up is included).

The worker count is 2 (``-j 2``), the target machine having two cores; on a shared
or throttled machine the speed-up is bounded by the CPU time actually available,
so the table also reports the CPU seconds every process used and the load average
seen while measuring: with two free cores the pool's wall time approaches half its
CPU time.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

JOBS = "2"
# The demo problem (64 devices, GBS 512) no longer takes the 20 s serially this needs
# since the knapsack kernel keeps only the DP's frontier; twice the devices and batch do.
LONG = ["-m", "llama-3-70b", "-d", "h100-sxm", "-n", "128", "--gbs", "1024", "-s", "8192"]
LONG += ["--exhaustive"]
TINY = ["-m", "llama-3-8b", "-d", "h100-sxm", "-n", "8", "--gbs", "64", "-s", "2048"]
SWEEP = ["-m", "llama-3-8b", "-m", "qwen3-30b-a3b", "-d", "h100-sxm", "-d", "a100-80gb"]
SWEEP += ["-n", "8", "-n", "16", "-n", "32", "-n", "64", "-n", "128", "--gbs", "256", "-s", "4096"]
SWEEP_SCENARIOS = 2 * 2 * 5


CPU = {"s": 0.0}
"""CPU seconds (user + system) of the last command and every process it started: the
pool's workers are children of its fork server, which outlives the command briefly; this
process adopts and reaps it (``_adopt_orphans``), so their CPU time is counted too."""
PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans() -> bool:
    """Linux: orphaned descendants become this process's children (and so are reaped here,
    with their CPU time). False where that is not available."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans(timeout: float = 10.0) -> None:
    """Wait for adopted descendants (the fork server exits once the command has)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _ndplan(*args: str) -> tuple[float, str]:
    """Wall seconds and stdout of one fresh ``ndplan`` process (its CPU time in ``CPU``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NDPLAN_")}
    env.update(NDPLAN_NO_PROGRESS="1", RAY_USAGE_STATS_ENABLED="0")
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", "from ndplan.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.perf_counter() - start
    _reap_orphans()
    CPU["s"] = _children_cpu() - cpu
    if proc.returncode != 0:
        raise RuntimeError(f"ndplan {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return seconds, proc.stdout


def _search(problem: list[str], *executor: str) -> tuple[float, dict]:
    seconds, out = _ndplan("search", *problem, "--json", *executor)
    result = json.loads(out)
    result["summary"].pop("seconds")
    return seconds, result


def _ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def main(repeats: int = 3) -> dict[str, float]:
    """Measure and print; return the figures (seconds unless named otherwise)."""
    if not _adopt_orphans():
        print("(the pool's CPU seconds leave out its workers: no subreaper here)")
    figures: dict[str, float] = {
        "cpus": float(os.cpu_count() or 1),
        "workers": float(JOBS),
        "repeats": float(repeats),
    }

    # 1. Speed-up on a long search: medians of `repeats` alternating runs (tens of
    # seconds each; one run apiece swung the ratio by ±0.07 on this machine).
    walls: dict[str, list[float]] = {"serial": [], "pool": []}
    cpus: dict[str, list[float]] = {"serial": [], "pool": []}
    for _ in range(repeats):
        wall, serial = _search(LONG, "-j", "1")
        walls["serial"].append(wall)
        cpus["serial"].append(CPU["s"])
        wall, pool = _search(LONG, "-j", JOBS)
        walls["pool"].append(wall)
        cpus["pool"].append(CPU["s"])
        assert pool == serial, "the pool changed the search's result"
    serial_s, pool_s = (statistics.median(walls[k]) for k in ("serial", "pool"))
    serial_cpu, pool_cpu = (statistics.median(cpus[k]) for k in ("serial", "pool"))
    figures.update(
        long_serial_s=serial_s,
        long_pool_s=pool_s,
        long_serial_cpu_s=serial_cpu,
        long_pool_cpu_s=pool_cpu,
        long_speedup=serial_s / pool_s,
        long_priced=float(serial["summary"]["priced"]),
    )

    # 2. Start-up overhead on a tiny search (medians).
    tiny_serial = statistics.median(_search(TINY, "-j", "1")[0] for _ in range(repeats))
    tiny_pool = statistics.median(_search(TINY, "-j", JOBS)[0] for _ in range(repeats))
    figures.update(
        tiny_serial_s=tiny_serial, tiny_pool_s=tiny_pool, pool_overhead_s=tiny_pool - tiny_serial
    )

    # 3. Sweep throughput: serial, pool, Ray (local instance, started by the command).
    rows = {}
    for name, executor in (
        ("serial", ["-j", "1"]),
        ("pool", ["-j", JOBS]),
        *([("ray", ["--executor", "ray", "-j", JOBS])] if _ray_available() else []),
    ):
        seconds, out = _ndplan("sweep", *SWEEP, "--json", *executor)
        rows[name] = json.loads(out)["scenarios"]
        assert len(rows[name]) == SWEEP_SCENARIOS
        figures[f"sweep_{name}_s"] = seconds
        figures[f"sweep_{name}_per_s"] = SWEEP_SCENARIOS / seconds
    assert all(r == rows["serial"] for r in rows.values()), "executors disagree on the sweep"
    if "sweep_ray_s" in figures:
        figures["sweep_ray_over_pool"] = figures["sweep_pool_s"] / figures["sweep_ray_s"]
    figures["load_average_1min"] = os.getloadavg()[0]

    print(table(figures))
    return figures


def table(f: dict[str, float]) -> str:
    lines = [
        f"{'measurement':<58} {'serial':>9} {'pool -j' + JOBS:>9} {'ray -j' + JOBS:>9}",
        f"{'search --exhaustive, 70B on 128 (' + str(int(f['long_priced'])) + ' priced), s':<58} "
        f"{f['long_serial_s']:>9.2f} {f['long_pool_s']:>9.2f} {'':>9}",
        f"{'  speed-up over serial':<58} {'':>9} {f['long_speedup']:>8.2f}× {'':>9}",
        f"{'  CPU seconds, all processes':<58} {f['long_serial_cpu_s']:>9.2f} "
        f"{f['long_pool_cpu_s']:>9.2f} {'':>9}",
        f"{'tiny search (llama-3-8b, 8 devices), median s':<58} "
        f"{f['tiny_serial_s']:>9.2f} {f['tiny_pool_s']:>9.2f} {'':>9}",
        f"{'  pool start-up overhead, s':<58} {'':>9} {f['pool_overhead_s']:>9.2f} {'':>9}",
        f"{f'sweep of {SWEEP_SCENARIOS} scenarios, s':<58} {f['sweep_serial_s']:>9.2f} "
        f"{f['sweep_pool_s']:>9.2f} {f.get('sweep_ray_s', float('nan')):>9.2f}",
        f"{'  scenarios per second':<58} {f['sweep_serial_per_s']:>9.2f} "
        f"{f['sweep_pool_per_s']:>9.2f} {f.get('sweep_ray_per_s', float('nan')):>9.2f}",
        f"(logical CPUs {int(f['cpus'])}, 1-minute load average at the end {f['load_average_1min']:.2f})",
    ]
    return "\n".join(lines)


def markdown(f: dict[str, float]) -> str:
    """The section ``make bench`` writes into docs/benchmarks.md."""
    ray = "ray" if "sweep_ray_s" in f else "ray (not installed)"
    return "\n".join(
        [
            "## Executors",
            "",
            f"Whole-process wall time of fresh `ndplan` commands, {JOBS} workers "
            f"({int(f['cpus'])} logical CPUs, load average {f['load_average_1min']:.2f} at the end).",
            "",
            f"| measurement | serial | pool `-j {JOBS}` | {ray} |",
            "|---|---|---|---|",
            f"| `search --exhaustive`, Llama-3-70B on 128 × H100, GBS 1,024 ({int(f['long_priced']):,} "
            "priced; medians of "
            f"{int(f['repeats'])} runs) | "
            f"{f['long_serial_s']:.2f} s | {f['long_pool_s']:.2f} s (×{f['long_speedup']:.2f}; "
            "target ≥ 1.5×) | |",
            f"| the same, CPU seconds of all processes | {f['long_serial_cpu_s']:.2f} s | "
            f"{f['long_pool_cpu_s']:.2f} s | |",
            f"| tiny search (start-up overhead) | {f['tiny_serial_s']:.2f} s | "
            f"{f['tiny_pool_s']:.2f} s (+{f['pool_overhead_s']:.2f} s) | |",
            f"| sweep, {SWEEP_SCENARIOS} scenarios | {f['sweep_serial_s']:.2f} s "
            f"({f['sweep_serial_per_s']:.2f}/s) | {f['sweep_pool_s']:.2f} s "
            f"({f['sweep_pool_per_s']:.2f}/s) | "
            + (
                f"{f['sweep_ray_s']:.2f} s ({f['sweep_ray_per_s']:.2f}/s)"
                if "sweep_ray_s" in f
                else "—"
            )
            + " |",
            "",
        ]
    )


if __name__ == "__main__":
    main()
