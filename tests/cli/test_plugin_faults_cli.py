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
    # The bad value fails in ndplan's own code that adds the parts up; the blame still
    # goes to the plugin whose object ndplan was holding, not to an internal error.
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
    expected = f"plugin '{name}': ndplan failed on what its Sloppy gave it (TypeError"
    line = fails_with(capsys, "-p", name, "estimate", *PROBLEM, "--tp", "2")
    assert expected in line and "check the types and values it returns" in line
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
