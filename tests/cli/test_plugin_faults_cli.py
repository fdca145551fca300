"""A third party's plugin that is wrong is named where it goes wrong: a value of the
wrong kind where it is registered, a factory that makes no port where it is made, code
that raises wherever it runs — each one line, exit 4, no traceback."""

from __future__ import annotations

import csv
import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from ndplan.bootstrap import bootstrap
from ndplan.cli.app import run
from ndplan.core.errors import InvalidInputError
from ndplan.core.job import Job
from ndplan.core.layout import SearchSpace
from ndplan.planner import Planner
from ndplan.plugins.hookspecs import hookimpl

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
PROBLEM = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048")
SMALL = (*PROBLEM, "-j", "1")
_serial = itertools.count()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(PLUGINS))


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a plugin module under a fresh name and return the name ``-p`` loads it by."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str) -> str:
        name = f"third_party_{next(_serial)}"
        header = "from ndplan.plugins.hookspecs import hookimpl\n"
        (tmp_path / f"{name}.py").write_text(header + textwrap.dedent(body))
        monkeypatch.delitem(sys.modules, name, raising=False)
        return name

    return write


def fails_with(capsys, *argv: str) -> str:
    """Run the CLI, expect exit 4 and one error line, and return that line."""
    code = run(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("assumed:")]
    assert code == 4, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_device_that_is_not_a_device_spec_is_refused_where_it_is_registered(
    capsys, plugin_module
) -> None:
    name = plugin_module(
        """
        @hookimpl
        def ndplan_register_devices(registry):
            registry.add("weird", {"id": "weird", "memory_gib": 1})
        """
    )
    # Refused at registration, so even a command that never uses it says so.
    line = fails_with(capsys, "-p", name, "devices")
    assert f"device 'weird' from '{name}' is a dict, not a DeviceSpec" in line


def test_a_factory_that_makes_no_memory_model_is_named(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        @hookimpl
        def ndplan_register_memory_models(registry):
            registry.add("ndplan", lambda: None, replace=True)
        """
    )
    line = fails_with(capsys, "-p", name, "search", *SMALL)
    assert f"memory model 'ndplan' (from '{name}') made a NoneType" in line
    assert "stage_static_bytes" in line and "MemoryModel port" in line


def test_a_cost_model_missing_methods_is_named(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        class Half:
            name = "ndplan"
            def __init__(self, calibration):
                pass
            def layer_seconds(self, ctx, layout, kind, recompute):
                return {}
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Half, replace=True)
        """
    )
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2")
    assert f"cost model 'ndplan' (from '{name}') made a Half that lacks stage_seconds, step" in line


def test_a_plugin_raising_in_estimate_exits_4_naming_it(capsys, plugin_module) -> None:
    # estimate prices outside the search's per-candidate guard: the top level traces it.
    name = plugin_module(
        """
        from ndplan.core.performance import NdplanCostModel
        class Exploding(NdplanCostModel):
            def step(self, *args, **kwargs):
                raise ValueError("step exploded")
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Exploding, replace=True)
        """
    )
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2")
    assert line == f"ndplan: error: plugin '{name}' raised ValueError: step exploded"


def test_a_cost_model_returning_the_wrong_type_is_the_plugins_fault(capsys, plugin_module) -> None:
    # The bad value is checked where ndplan receives it, and named with the part: before,
    # it failed in ndplan's own code that adds the parts up.
    name = plugin_module(
        """
        from ndplan.core.performance import NdplanCostModel
        class Sloppy(NdplanCostModel):
            def layer_seconds(self, ctx, layout, kind, recompute):
                parts = dict(super().layer_seconds(ctx, layout, kind, recompute))
                parts["tp_comm"] = "slow"
                return parts
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Sloppy, replace=True)
        """
    )
    expected = f"plugin '{name}': cost model Sloppy: layer_seconds returned tp_comm='slow' (a str)"
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2")
    assert expected in line and "every part must be a finite number of seconds" in line
    for jobs in ("1", "2"):
        line = fails_with(capsys, "-p", name, "search", *PROBLEM, "-j", jobs)
        assert expected in line, line


def test_a_raising_debug_sink_exits_4_naming_it(capsys, plugin_module, tmp_path: Path) -> None:
    name = plugin_module(
        """
        class Exploding:
            name = "exploding"
            def open(self, directory): pass
            def memory(self, candidate, parts): raise RuntimeError("sink exploded")
            def time(self, candidate, parts): pass
            def refusal(self, candidate, reason): pass
            def close(self): pass
        @hookimpl
        def ndplan_register_debug_sinks(registry):
            registry.add("exploding", Exploding)
        """
    )
    out = tmp_path / "debug"
    line = fails_with(
        capsys, "-p", name, "search", *SMALL, "--debug-dir", str(out), "--debug-sink", "exploding"
    )
    assert line == f"ndplan: error: plugin '{name}' raised RuntimeError: sink exploded"


def test_a_refusal_rule_answering_a_non_string_is_a_plugin_error(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        def forty_two(layout, context):
            return 42 if layout.tp == 2 else None
        @hookimpl
        def ndplan_register_refusal_rules(registry):
            registry.add("answers-42", forty_two)
        """
    )
    line = fails_with(capsys, "-p", name, "search", *SMALL)
    assert f"refusal rule 'answers-42' (plugin '{name}') returned a int for layout tp2" in line
    assert "return a reason string to refuse, or None" in line


def test_a_refusal_rules_reason_reaches_the_debug_sinks(capsys, tmp_path: Path) -> None:
    out = tmp_path / "debug"
    code = run(["-p", "search_rules", "search", *SMALL, "--debug-dir", str(out)])
    assert code == 0, capsys.readouterr().err
    with (out / "debug_refusals.csv").open() as fh:
        reasons = {row["reason"] for row in csv.DictReader(fh)}
    assert "search_rules_no_cp: context parallelism is off limits here" in reasons


def test_a_hook_with_a_wrong_signature_is_one_line(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        @hookimpl
        def ndplan_register_devices(registry, extra):
            pass
        """
    )
    line = fails_with(capsys, "-p", name, "devices")
    assert f"plugin '{name}' (module {name}) could not register" in line and "'extra'" in line


class _PoolLike:
    """An executor that is not serial (its workers would rebuild the plugins by name)."""

    name = "pool"

    def map(self, task, recipe, items):
        raise AssertionError("a search with in-process plugins must not reach the workers")

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass


class _InProcessRule:
    @hookimpl
    def ndplan_register_refusal_rules(self, registry):
        registry.add("no-tp8", lambda layout, ctx: "tp 8 is out" if layout.tp == 8 else None)


def test_in_process_plugins_refuse_an_executor_with_workers() -> None:
    planner = Planner(bootstrap(extra=[_InProcessRule()], entry_points=False))
    ctx = planner.context(
        planner.model("llama-3-8b"),
        planner.device("h100"),
        8,
        Job(global_batch_size=16, seq_length=2048),
    )
    with pytest.raises(InvalidInputError, match=r"in-process plugins \(_InProcessRule\)"):
        planner.search(ctx, SearchSpace(), executor=_PoolLike())
    # Serially the rule is there, and applied.
    outcome = planner.search(ctx, SearchSpace(), top_k=3)
    assert outcome.result.summary.refused["no-tp8"] > 0


# --------------------------------------------------------------- what a cost model returns

_RETURNS = """
    from ndplan.core.performance import NdplanCostModel
    class Odd(NdplanCostModel):
        def layer_seconds(self, ctx, layout, kind, recompute):
            parts = dict(super().layer_seconds(ctx, layout, kind, recompute))
            if {when}:
                parts["{part}"] = {value}
            return parts
    @hookimpl
    def ndplan_register_cost_models(registry):
        registry.add("ndplan", Odd, replace=True)
    """


def returning(plugin_module, part: str, value: str, when: str = "True") -> str:
    """A plugin whose cost model returns ``value`` for ``part`` of a layer's seconds."""
    return plugin_module(_RETURNS.format(part=part, value=value, when=when))


def test_a_cost_model_returning_a_string_is_named_by_every_command(capsys, plugin_module) -> None:
    # The example docs/executors.md gives. The search weighs the output layer through
    # the cost model first (Pricer.head_weight): that was an internal error (exit 5).
    name = returning(plugin_module, "forward", "'slow'")
    wrong = "cost model Odd: layer_seconds returned forward='slow' (a str) for layer kind"
    for argv in (
        ("estimate", *PROBLEM, "--tp", "2"),
        ("search", *PROBLEM, "-j", "1"),
        ("search", *PROBLEM, "-j", "2"),
        ("balance", *PROBLEM, "--pp", "2"),
        ("sweep", *PROBLEM, "-j", "1"),
    ):
        line = fails_with(capsys, "-p", name, *argv)
        assert f"plugin '{name}': {wrong}" in line, (argv, line)
        assert "finite number of seconds" in line


@pytest.mark.parametrize(
    ("value", "shown"), [("float('nan')", "nan"), ("-1.0", "-1.0"), ("float('inf')", "inf")]
)
def test_a_cost_model_returning_no_time_is_a_plugin_error(
    capsys, plugin_module, value: str, shown: str
) -> None:
    # A NaN compares false with everything: candidates dropped out of the ranking without
    # a word (exit 0), or the split's arithmetic failed (exit 5); a negative part printed
    # a negative step.
    name = returning(plugin_module, "recompute", value, when="layout.tp == 2")
    wrong = f"plugin '{name}': cost model Odd: layer_seconds returned recompute={shown} for"
    line = fails_with(capsys, "-p", name, "search", *SMALL)
    assert line.startswith("ndplan: error: candidate tp=2 ") or "at tp=2 " in line, line
    assert wrong in line, line
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2", "--json")
    assert wrong in line, line
    assert capsys.readouterr().out == ""


def test_a_cost_model_whose_stage_seconds_are_not_seconds_is_named(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        from ndplan.core.performance import NdplanCostModel
        class Stages(NdplanCostModel):
            def stage_seconds(self, ctx, layout, stage, assignment):
                parts = super().stage_seconds(ctx, layout, stage, assignment)
                parts["pp_comm"] = -0.5
                return parts
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Stages, replace=True)
        """
    )
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2")
    assert f"plugin '{name}': cost model Stages: stage_seconds returned pp_comm=-0.5" in line


def test_a_cost_model_step_that_is_negative_is_named(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        from ndplan.core.performance import NdplanCostModel
        class Early(NdplanCostModel):
            def step(self, ctx, layout, stages, seconds):
                time = super().step(ctx, layout, stages, seconds)
                return time.model_copy(update={"step_s": -time.step_s})
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Early, replace=True)
        """
    )
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2", "--json")
    assert f"plugin '{name}': cost model Early: step returned step_s=-" in line


# --------------------------------------------------------------- one line, whatever it raised


def test_a_plugin_exception_spanning_lines_is_reported_on_one(capsys, plugin_module) -> None:
    name = plugin_module(
        """
        from ndplan.core.performance import NdplanCostModel
        class Profiled(NdplanCostModel):
            def layer_seconds(self, ctx, layout, kind, recompute):
                raise RuntimeError("profile lookup failed\\n  at row 17\\n  column tp")
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Profiled, replace=True)
        """
    )
    expected = f"plugin '{name}' raised RuntimeError: profile lookup failed; at row 17; column tp"
    assert fails_with(capsys, "-p", name, "estimate", *PROBLEM).endswith(expected)
    assert fails_with(capsys, "-p", name, "search", *SMALL).endswith(expected)


def test_a_device_plugin_missing_a_field_is_one_line_naming_the_field(
    capsys, plugin_module
) -> None:
    name = plugin_module(
        """
        from ndplan.core.cluster import DeviceSpec
        @hookimpl
        def ndplan_register_devices(registry):
            spec = DeviceSpec(
                id="x2000", name="Acme X2000", memory_gib=96, peak_tflops={"bf16": 1200},
                scale_up={"bandwidth_gb_per_s": 450, "domain_size": 8},
                scale_out={"bandwidth_gb_per_s": 50}, host_link={"bandwidth_gb_per_s": 64},
            )
            registry.add(spec.id, spec)
        """
    )
    line = fails_with(capsys, "-p", name, "devices")
    assert line == (
        f"ndplan: error: plugin '{name}' failed in ndplan_register_devices: "
        "device 'x2000': hbm_bandwidth_gb_per_s: Field required"
    )


# --------------------------------------------------------------- readers


def test_a_model_reader_returning_no_model_spec_is_named(
    capsys, plugin_module, tmp_path: Path
) -> None:
    name = plugin_module(
        """
        class Nothing:
            name = "nothing"
            def can_read(self, path):
                return path.suffix == ".nothing"
            def read(self, path, recorder):
                return None
        @hookimpl
        def ndplan_register_model_readers(registry):
            registry.add("aaa-nothing", Nothing())
        """
    )
    config = tmp_path / "model.nothing"
    config.write_text("{}")
    line = fails_with(capsys, "-p", name, "models", "show", str(config))
    assert f"model reader 'aaa-nothing' of plugin '{name}' returned NoneType for {config}" in line
    assert "a model reader returns a ModelSpec" in line


# --------------------------------------------------------------- debug sinks


def test_a_plugin_sink_that_cannot_open_is_the_plugins_fault(
    capsys, plugin_module, tmp_path: Path
) -> None:
    # It was reported as the user's folder: "--debug-dir D: cannot write there" (exit 3).
    name = plugin_module(
        """
        class Database:
            name = "db"
            def open(self, directory): raise OSError("cannot open database")
            def memory(self, candidate, parts): pass
            def time(self, candidate, parts): pass
            def refusal(self, candidate, reason): pass
            def close(self): pass
        @hookimpl
        def ndplan_register_debug_sinks(registry):
            registry.add("db", Database)
        """
    )
    out = tmp_path / "debug"
    argv = ("search", *SMALL, "--debug-dir", str(out), "--debug-sink", "csv", "--debug-sink", "db")
    line = fails_with(capsys, "-p", name, *argv)
    assert line == (
        f"ndplan: error: debug sink 'db' (from '{name}') could not open: "
        "OSError: cannot open database"
    )
    assert not out.exists()  # the csv sink opened first (and made the folder): aborted


def test_a_built_in_sink_in_an_unwritable_folder_is_still_the_users(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ndplan.adapters.sinks.files import CsvSink

    def unwritable(self, directory):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(CsvSink, "open", unwritable)
    out = tmp_path / "debug"
    code = run(["search", *SMALL, "--debug-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 3, err
    assert f"--debug-dir {out}: cannot write there (Permission denied)" in err


@pytest.fixture
def tracked(monkeypatch: pytest.MonkeyPatch):
    """tests/plugins/tracked_sink.py, its log of calls emptied."""
    import tracked_sink

    tracked_sink.CALLS.clear()
    monkeypatch.delenv("TRACKED_CLOSE", raising=False)
    return tracked_sink


def failing_cost(plugin_module, raised: str) -> str:
    """A plugin whose cost model raises ``raised`` at tp 2 (the bound pass meets it)."""
    return plugin_module(
        f"""
        from ndplan.core.performance import NdplanCostModel
        class Failing(NdplanCostModel):
            def layer_seconds(self, ctx, layout, kind, recompute):
                if layout.tp == 2:
                    raise {raised}
                return super().layer_seconds(ctx, layout, kind, recompute)
        @hookimpl
        def ndplan_register_cost_models(registry):
            registry.add("ndplan", Failing, replace=True)
        """
    )


SINKS = ("csv", "tracked", "closing", "jsonl")


@pytest.mark.parametrize(
    ("raised", "code"), [('RuntimeError("no tp 2")', 4), ("KeyboardInterrupt", 130)]
)
def test_a_search_that_fails_aborts_its_sinks_and_leaves_no_records(
    capsys, plugin_module, tracked, tmp_path: Path, raised: str, code: int
) -> None:
    # Fix: the sinks were neither closed nor aborted: a plugin's half-written file stayed.
    cost = failing_cost(plugin_module, raised)
    out = tmp_path / "debug"
    sinks = [arg for name in SINKS for arg in ("--debug-sink", name)]
    argv = ["-p", cost, "-p", "tracked_sink", "search", *SMALL, "--debug-dir", str(out), *sinks]
    assert run(argv) == code, capsys.readouterr().err
    capsys.readouterr()
    # A sink with abort() is aborted; one without is closed, its one chance to clean up.
    assert tracked.CALLS == [
        ("tracked", "open"),
        ("closing", "open"),
        ("tracked", "abort"),
        ("closing", "close"),
    ]
    # No built-in sink's file, no temporary one; what 'closing' keeps is its own choice.
    assert sorted(p.name for p in out.iterdir()) == ["closing.tsv"]


def test_a_plugin_sink_failing_to_close_leaves_no_built_in_files(
    capsys, tracked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The csv sink, named first, was closed first: its files stayed behind the error.
    monkeypatch.setenv("TRACKED_CLOSE", "raise")
    out = tmp_path / "debug"
    sinks = ("--debug-sink", "csv", "--debug-sink", "jsonl", "--debug-sink", "tracked")
    line = fails_with(
        capsys, "-p", "tracked_sink", "search", *SMALL, "--debug-dir", str(out), *sinks
    )
    assert (
        line == "ndplan: error: plugin 'tracked_sink' raised RuntimeError: tracked could not close"
    )
    assert tracked.CALLS == [("tracked", "open"), ("tracked", "close")]
    assert sorted(p.name for p in out.iterdir()) == ["tracked.tsv"]


def test_a_failed_check_after_the_search_keeps_no_records(capsys, tracked, tmp_path: Path) -> None:
    # Checked after the search, before the records were kept: they were kept all the same.
    out = tmp_path / "debug"
    sinks = ("--debug-sink", "csv", "--debug-sink", "tracked")
    one_plan = ("--tp", "8", "--pp", "1", "--mbs", "1", "--recompute", "full", "--zero", "1")
    one_plan += ("--sp", "--no-offload-optimizer")
    argv = ["-p", "tracked_sink", "search", *SMALL, *one_plan, "--explain", "2"]
    assert run([*argv, "--debug-dir", str(out), *sinks]) == 3
    assert "--explain 2: only 1 plans fit" in capsys.readouterr().err
    assert tracked.CALLS == [("tracked", "open"), ("tracked", "abort")]
    assert not out.exists()


@pytest.mark.parametrize("command", [("estimate", "--tp", "2"), ("search", "-j", "1")])
def test_a_part_missing_from_a_plugins_stage_seconds_is_the_plugins_fault(capsys, command) -> None:
    """ndplan's own code meets the missing part; the classifier sees the output check in
    hand and looks through it to the plugin's model (exit 4, not an internal error)."""
    line = fails_with(capsys, "-p", "missing_part_cost", command[0], *PROBLEM, *command[1:])
    assert "plugin 'missing_part_cost'" in line and "MissingBackward" in line
    assert "internal error" not in line
