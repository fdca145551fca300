"""Faults (spec/executors.md, "Closing"): an exception in a worker, a killed worker or
Ctrl-C aborts the search with one line (naming the candidate and the error), the
documented exit code (4 from a plugin, 5 internal, 130 interrupted), every worker
terminated — no orphan processes — and no output file, not even a temporary one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import default_sigint

from ndplan.adapters.executors.faults import classify, plugin_origin
from ndplan.cli.app import run
from ndplan.core.errors import InternalError, PluginError

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"
SMALL = ["-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "256", "-s", "8192"]
# Pricing every candidate of the demo problem takes tens of seconds: long enough to
# interrupt it mid-search.
LONG = ["-m", "llama-3-70b", "-d", "h100", "-n", "64", "--gbs", "512", "-s", "8192"]
LONG += ["--exhaustive"]
TICKS = os.sysconf("SC_CLK_TCK")


def env(**extra: str) -> dict[str, str]:
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NDPLAN_PLUGINS", "NDPLAN_JOBS", "NDPLAN_DEBUG", "NDPLAN_DISABLE_PLUGINS")
    }
    out.update(NDPLAN_NO_PROGRESS="1", PYTHONPATH=str(PLUGINS), **extra)
    return out


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from ndplan.cli.app import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        preexec_fn=default_sigint,  # the Ctrl-C test needs SIGINT deliverable
    )


def stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def running(pid: int) -> bool:
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry))
    return sorted(out)


def descendants(pid: int) -> list[int]:
    """Children, grandchildren and so on (pool workers are the fork server's children)."""
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return sorted(out)


def pool_workers(pid: int) -> list[int]:
    """The pool's workers: children of the fork server, or spawned children."""
    out = []
    for child in children(pid):
        line = cmdline(child)
        if "spawn_main" in line:
            out.append(child)
        elif "forkserver" in line:
            out += children(child)
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def cpu_seconds(pid: int) -> float:
    fields = stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICKS


def workers_busy(proc: subprocess.Popen, count: int = 2, timeout: float = 120) -> list[int]:
    """The pool's worker pids, once each has spent a while pricing (i.e. mid-search)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        workers = pool_workers(proc.pid)
        if len(workers) == count and all(cpu_seconds(p) > 2.0 for p in workers):
            return workers
        time.sleep(0.1)
    raise AssertionError("the workers never got busy")


def assert_all_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if running(p)], "orphan processes left behind"


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("ndplan: error: ")
    return lines[0]


def assert_no_output(folder: Path) -> None:
    assert not folder.exists() or list(folder.iterdir()) == [], list(folder.iterdir())


# --------------------------------------------------------------- a plugin raising


def search_with_plugin(plugin: str, jobs: str, ranking: Path) -> tuple[int, str, list[int]]:
    """``ndplan -p PLUGIN search`` of the small problem as a fresh process (the pool's
    workers import the plugin from PYTHONPATH): its exit code, its stderr, and every
    process it started (recorded while they live)."""
    proc = start("-p", plugin, "search", *SMALL, "-j", jobs, "--ranking-csv", str(ranking))
    pids: list[int] = []
    while proc.poll() is None:
        pids = sorted(set(pids) | set(descendants(proc.pid)))
        time.sleep(0.02)
    _, err = proc.communicate()
    return proc.returncode, err, pids


def plugin_failure(plugin: str, jobs: str, tmp_path: Path) -> tuple[str, list[int]]:
    """``search_with_plugin`` where the plugin's fault must end the run: exit 4, no
    ranking written; its one stderr line and the processes it started."""
    out = tmp_path / "out"
    code, err, pids = search_with_plugin(plugin, jobs, out / "r.csv")
    assert code == 4, err
    line = one_line(err)
    assert_no_output(out)
    return line, pids


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_plugin_raising_on_a_candidate_exits_4_naming_it(jobs: str, tmp_path: Path) -> None:
    line, pids = plugin_failure("faulty_cost", jobs, tmp_path)
    assert "candidate tp=2 " in line and " cp=2 " in line
    assert "plugin 'faulty_cost' raised RuntimeError: faulty_cost refuses tp 2 with cp 2" in line
    assert_all_gone(pids)


# --------------------------------------------------------------- a worker killed


@pytest.mark.slow
def test_a_killed_worker_exits_5_with_one_line_and_no_orphans(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start("search", *LONG, "-j", "2", "--ranking-csv", str(out / "r.csv"))
    try:
        workers = workers_busy(proc)
        # The workers, their fork server and multiprocessing's resource tracker.
        everyone = descendants(proc.pid)
        os.kill(workers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 5, err
    line = one_line(err)
    # Between batches a worker may be idle; otherwise the line names what it held.
    assert f"worker process {workers[0]} died (killed by SIGKILL) while " in line
    assert "while idle" in line or "while pricing tp=" in line
    assert_all_gone(everyone)
    assert_no_output(out)


# --------------------------------------------------------------- Ctrl-C


@pytest.mark.slow
def test_ctrl_c_mid_search_exits_130_with_no_orphans(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start("search", *LONG, "-j", "2", "--ranking-csv", str(out / "r.csv"))
    try:
        workers_busy(proc)
        everyone = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) <= 1, err
    assert_all_gone(everyone)
    assert_no_output(out)


# --------------------------------------------------------------- in-process: the serial path


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        monkeypatch.delenv(var, raising=False)
    import faulty_cost

    return faulty_cost


def test_serial_plugin_failure_is_a_plugin_error(faulty, capsys, tmp_path: Path) -> None:
    code = run(
        ["-p", "faulty_cost", "search", *SMALL, "-j", "1", "--ranking-csv", str(tmp_path / "r.csv")]
    )
    assert code == 4
    line = one_line(capsys.readouterr().err)
    assert "plugin 'faulty_cost' raised RuntimeError" in line and "candidate tp=2 " in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "every-plan-priced"])
def test_the_error_line_does_not_depend_on_the_worker_count(
    faulty, capsys, tmp_path: Path, bounded: bool
) -> None:
    # Many candidates fail; each worker's chunk fails at its own first. The line names the
    # candidate a serial run meets first, however the workers raced. Without bounding
    # (--ranking-csv prices every plan) the batches are large: in-process the serial run
    # met its first failure in the batch's order while the workers met theirs in the
    # cache-locality order the batch is sent in, so the two named different candidates.
    lines = []
    for jobs in ("1", "2"):
        out = tmp_path / jobs / "r.csv"
        extra = ["--exhaustive"] if not bounded else []
        argv = ["-p", "faulty_cost", "search", *SMALL, "-j", jobs, *extra]
        code = run([*argv, "--ranking-csv", str(out)] if not bounded else argv)
        assert code == 4
        lines.append(one_line(capsys.readouterr().err))
        assert not out.exists()
    assert lines[0] == lines[1], lines


def _raise_from(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


def test_the_innermost_owned_frame_decides_whose_fault(faulty) -> None:
    from ndplan.core.search import candidate_layout

    from_plugin = _raise_from(lambda: faulty.FaultyCostModel.step(None, None, _TP2_CP2, (), ()))
    assert plugin_origin(from_plugin, ["faulty_cost"]) == "faulty_cost"
    assert isinstance(classify(from_plugin, "candidate x", ["faulty_cost"]), PluginError)

    # Code of a plugin module (or a submodule) calling into the standard library: the
    # library's frames are skipped, the plugin is blamed.
    plugin = {"__name__": "some_plugin.sub"}
    exec("import json\ndef parse():\n    return json.loads('{')\n", plugin)
    from_stdlib = _raise_from(plugin["parse"])
    assert plugin_origin(from_stdlib, ["some_plugin"]) == "some_plugin"

    # ndplan's own code raising, even when a plugin called it: internal.
    from_ndplan = _raise_from(lambda: candidate_layout((1, 2)))
    assert plugin_origin(from_ndplan, ["faulty_cost"]) is None
    error = classify(from_ndplan, "candidate x", ["faulty_cost"])
    assert isinstance(error, InternalError)
    assert str(error).startswith("candidate x: internal error: ValueError")
    assert "NDPLAN_DEBUG=1" in str(error)


_TP2_CP2 = type("Layout", (), {"tp": 2, "cp": 2})()


def test_a_plugins_cost_model_is_checked_and_ndplans_own_is_not(faulty) -> None:
    from ndplan.bootstrap import bootstrap
    from ndplan.core.job import Job
    from ndplan.core.layout import Layout
    from ndplan.core.performance import NdplanCostModel
    from ndplan.core.pricing import CheckedCostModel, PortOutputError, Pricer
    from ndplan.planner import Planner

    planner = Planner(bootstrap(entry_points=False))
    ctx = planner.context(
        planner.model("llama-3-8b"),
        planner.device("h100"),
        8,
        Job(global_batch_size=16, seq_length=2048),
    )
    shipped = planner.pricer(ctx)
    # The built-in model is ndplan's, tested: not wrapped, so its search pays nothing.
    assert type(shipped.cost) is NdplanCostModel
    plugged = Pricer(ctx, shipped.memory, faulty.FaultyCostModel(ctx.calibration), shipped.solver)
    assert isinstance(plugged.cost, CheckedCostModel)
    assert plugged.cost.name == "ndplan"  # everything else reads through

    class Nan(faulty.FaultyCostModel):
        def layer_seconds(self, ctx, layout, kind, recompute):
            return {**super().layer_seconds(ctx, layout, kind, recompute), "ep_comm": float("nan")}

    Nan.__module__ = "faulty_cost"  # defined by the plugin module, as its classes are
    checked = Pricer(ctx, shipped.memory, Nan(ctx.calibration), shipped.solver)
    kind = ctx.model.kinds[0]
    layout = Layout(tp=2, pp=1, dp=4, mbs=1, num_microbatches=4)
    bad = _raise_from(lambda: checked.cost.layer_seconds(ctx, layout, kind, frozenset()))
    assert isinstance(bad, PortOutputError)
    # Blamed by the model's class, with no plugin frame on the stack; one line.
    error = classify(bad, "candidate x", ["faulty_cost"])
    assert isinstance(error, PluginError)
    assert str(error) == (
        f"candidate x: plugin 'faulty_cost': cost model Nan: layer_seconds returned "
        f"ep_comm=nan for layer kind '{kind.name}' under recompute none; every part must be "
        "a finite number of seconds ≥ 0"
    )
    # ndplan's own error is one line too, whatever its message spans.
    internal = classify(ValueError("first\n  second"), "candidate x", ["faulty_cost"])
    assert isinstance(internal, InternalError)
    assert str(internal).startswith("candidate x: internal error: ValueError: first; second")


# --------------------------------------------------------------- a plugin's memory model


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_memory_models_nan_is_the_plugins_error(jobs: str, tmp_path: Path) -> None:
    # Unchecked, the NaN activations of full recompute compared false with the budget and
    # the search ranked plans as if nothing were wrong (exit 0).
    line, _ = plugin_failure("nan_memory", jobs, tmp_path)
    assert line.endswith(
        ": plugin 'nan_memory': memory model NanMemoryModel: layer_activation_bytes returned "
        "nan for layer kind 'attn+dense' under recompute full; it must be a finite number of "
        "bytes ≥ 0"
    ), line


def test_a_plugins_memory_model_is_checked_and_ndplans_own_is_not() -> None:
    from ndplan.bootstrap import bootstrap
    from ndplan.core.job import Job
    from ndplan.core.memory import NdplanMemoryModel
    from ndplan.core.pricing import CheckedMemoryModel, PortOutputError, Pricer
    from ndplan.planner import Planner

    planner = Planner(bootstrap(entry_points=False))
    model, device = planner.model("llama-3-8b"), planner.device("h100")

    def fresh_context():  # each pricer its own cache: priced parts are its model's
        return planner.context(model, device, 8, Job(global_batch_size=16, seq_length=2048))

    ctx = fresh_context()
    shipped = planner.pricer(ctx)
    assert type(shipped.memory) is NdplanMemoryModel  # ndplan's own, tested: not wrapped
    layout = planner.layout(ctx, tp=2, recompute="auto")

    def pricer_with(model_class: type) -> Pricer:
        model_class.__module__ = "odd_memory"  # defined by a plugin module, as its classes are
        return Pricer(fresh_context(), model_class(), shipped.cost, shipped.solver)

    class Fractional(NdplanMemoryModel):
        def layer_activation_bytes(self, ctx, layout, kind, recompute):
            return super().layer_activation_bytes(ctx, layout, kind, recompute) + 0.25

        def stage_static_bytes(self, ctx, layout, stage):
            parts = super().stage_static_bytes(ctx, layout, stage)
            return {**parts, "weights": parts["weights"] + 0.5}

    fractional = pricer_with(Fractional)
    assert isinstance(fractional.memory, CheckedMemoryModel)
    assert fractional.memory.name == "ndplan"  # everything else reads through
    # Whole bytes, rounded up: one more byte for the static part and each activation.
    exact, rounded = shipped.price(layout), fractional.price(layout)
    assert type(rounded.peak_bytes) is int
    assert rounded.peak_bytes > exact.peak_bytes
    kind = ctx.model.kinds[0]
    assert fractional.memory.layer_activation_bytes(
        ctx, layout, kind, frozenset()
    ) == 1 + shipped.memory.layer_activation_bytes(ctx, layout, kind, frozenset())

    class NegativeWeights(NdplanMemoryModel):
        def stage_static_bytes(self, ctx, layout, stage):
            return {**super().stage_static_bytes(ctx, layout, stage), "weights": -1}

    bad = _raise_from(lambda: pricer_with(NegativeWeights).price(layout))
    assert isinstance(bad, PortOutputError)
    assert bad.owner == "odd_memory"
    assert str(bad) == (
        "memory model NegativeWeights: stage_static_bytes returned weights=-1 for stage 0; "
        "every part must be a finite number of bytes ≥ 0"
    )

    class Text(NdplanMemoryModel):
        def layer_activation_bytes(self, ctx, layout, kind, recompute):
            return "12"

    bad = _raise_from(lambda: pricer_with(Text).price(layout))
    assert str(bad) == (
        f"memory model Text: layer_activation_bytes returned '12' (a str) for layer kind "
        f"'{kind.name}' under recompute none; it must be a finite number of bytes ≥ 0"
    )

    # ndplan's code failing on what the wrapped model gave it blames the model's plugin.
    ndplan_code = {"__name__": "ndplan.core.elsewhere"}
    exec("def total(memory):\n    raise ValueError('cannot add it up')\n", ndplan_code)
    failed = _raise_from(lambda: ndplan_code["total"](pricer_with(Text).memory))
    error = classify(failed, "candidate x", ["odd_memory"])
    assert isinstance(error, PluginError)
    assert str(error).startswith("candidate x: plugin 'odd_memory': ndplan failed on what its Text")
