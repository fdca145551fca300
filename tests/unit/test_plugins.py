"""Plugins through the composition root: in-process fakes, importable modules, entry points.

Entry points are faked at the ``importlib.metadata`` seam the manager reads; a real
installed distribution is exercised in tests/integration/test_entry_point_distribution.py.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ndplan.bootstrap import REGISTRIES, bootstrap
from ndplan.cli.app import run
from ndplan.core.cluster import DeviceSpec
from ndplan.core.errors import ExitCode, PluginError
from ndplan.core.layout import Layout
from ndplan.core.ports import Exported
from ndplan.plugins import builtin, hookspecs, manager
from ndplan.plugins.hookspecs import hookimpl
from ndplan.plugins.manager import BUILTIN_NAME, make_plugin_manager


@pytest.fixture(autouse=True)
def _no_plugins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG"):
        monkeypatch.delenv(var, raising=False)


def device(device_id: str, memory_gib: float = 64.0) -> DeviceSpec:
    """A small, valid device type."""
    return DeviceSpec.model_validate(
        {
            "id": device_id,
            "name": f"Test {device_id}",
            "memory_gib": memory_gib,
            "peak_tflops": {"bf16": 400.0},
            "hbm_bandwidth_gb_per_s": 2000.0,
            "scale_up": {"bandwidth_gb_per_s": 200.0},
            "scale_out": {"bandwidth_gb_per_s": 25.0},
            "host_link": {"bandwidth_gb_per_s": 32.0},
        }
    )


def refuse_odd_tp(layout: Layout, context: object) -> str | None:
    return "odd tp" if layout.tp % 2 else None


class FakeAccelPlugin:
    """A third-party plugin: one device and one refusal rule; records what it saw."""

    def __init__(self) -> None:
        self.devices_seen: list[str] | None = None

    @hookimpl
    def ndplan_register_devices(self, registry):
        self.devices_seen = list(registry)
        registry.add("fake-accel", device("fake-accel"), aliases=("Fake Accel 1",))

    @hookimpl
    def ndplan_register_refusal_rules(self, registry):
        registry.add("fake-no-odd-tp", refuse_odd_tp)


class StubReader:
    """The ModelReader port's members, reading nothing."""

    name = "every-reader"

    def can_read(self, path):
        return False

    def read(self, path, recorder):
        raise NotImplementedError


class StubExporter:
    """The Exporter port's members."""

    name = "every-export"
    suffix = ".txt"
    framework = None

    def render(self, plan, ctx, price=None):
        return Exported(text="")


class EveryHookPlugin:
    """Implements every hook; each adds one uniquely named component."""

    @hookimpl
    def ndplan_register_devices(self, registry):
        registry.add("every-accel", device("every-accel"))

    @hookimpl
    def ndplan_register_presets(self, registry):
        registry.add("every-preset", lambda: {"model_type": "llama"})

    @hookimpl
    def ndplan_register_model_readers(self, registry):
        registry.add("every-reader", StubReader())

    @hookimpl
    def ndplan_register_memory_models(self, registry):
        registry.add("every-memory", object)

    @hookimpl
    def ndplan_register_cost_models(self, registry):
        registry.add("every-cost", lambda calibration: object())

    @hookimpl
    def ndplan_register_knapsack_solvers(self, registry):
        registry.add("every-knapsack", lambda bucket_bytes: object())

    @hookimpl
    def ndplan_register_refusal_rules(self, registry):
        registry.add("every-rule", refuse_odd_tp)

    @hookimpl
    def ndplan_register_executors(self, registry):
        registry.add("every-executor", lambda jobs, options: object())

    @hookimpl
    def ndplan_register_debug_sinks(self, registry):
        registry.add("every-sink", object)

    @hookimpl
    def ndplan_register_exporters(self, registry):
        registry.add("every-export", StubExporter())


def _spec_names() -> list[str]:
    return sorted(
        name
        for name in vars(hookspecs)
        if name.startswith("ndplan_") and callable(getattr(hookspecs, name))
    )


# --------------------------------------------------------------- in-process plugins


def test_an_in_process_plugin_adds_a_device_and_a_refusal_rule() -> None:
    plugin = FakeAccelPlugin()
    comps = bootstrap(extra=[plugin], entry_points=False)

    entry = comps.devices.entry("fake-accel")
    assert entry.plugin == "FakeAccelPlugin"
    assert entry.value.memory_gib == 64.0
    assert comps.devices.get("fake accel 1").id == "fake-accel"
    assert "h100-sxm" in comps.devices  # the built-ins are still there
    assert comps.refusal_rules.rules == [("fake-no-odd-tp", refuse_odd_tp)]
    _, rule = comps.refusal_rules.rules[0]
    assert rule(Layout(tp=3), None) == "odd tp"
    assert rule(Layout(tp=4), None) is None

    info = {p.name: p for p in comps.plugins}
    assert info["FakeAccelPlugin"].source == "in-process"
    assert info["FakeAccelPlugin"].hooks == (
        "ndplan_register_devices",
        "ndplan_register_refusal_rules",
    )
    assert comps.plugins[0].name == BUILTIN_NAME  # the listing starts with the built-in


def test_every_hook_feeds_its_registry() -> None:
    comps = bootstrap(extra=[EveryHookPlugin()], entry_points=False)

    for attr, (_, hook_name, _) in REGISTRIES.items():
        registry = getattr(comps, attr)
        mine = [e.name for e in registry.entries() if e.plugin == "EveryHookPlugin"]
        assert len(mine) == 1, f"{hook_name} added nothing to {attr}"
    assert [n for n, _ in comps.refusal_rules.rules] == ["every-rule"]
    (info,) = (p for p in comps.plugins if p.name == "EveryHookPlugin")
    assert list(info.hooks) == _spec_names()


def test_a_plugin_replaces_a_builtin_device_only_when_it_says_so() -> None:
    class Derate:
        @hookimpl
        def ndplan_register_devices(self, registry):
            registry.add("h100-sxm", device("h100-sxm", memory_gib=70.0), replace=True)

    class Clash:
        @hookimpl
        def ndplan_register_devices(self, registry):
            registry.add("h100-sxm", device("h100-sxm", memory_gib=70.0))

    entry = bootstrap(extra=[Derate()], entry_points=False).devices.entry("H100")
    assert (entry.plugin, entry.replaced, entry.value.memory_gib) == ("Derate", BUILTIN_NAME, 70.0)

    with pytest.raises(PluginError, match=r"'h100-sxm' is registered by both 'Clash' and"):
        bootstrap(extra=[Clash()], entry_points=False)


def test_a_plugin_raising_in_a_hook_is_a_plugin_error_naming_it() -> None:
    class Exploding:
        @hookimpl
        def ndplan_register_devices(self, registry):
            raise RuntimeError("datasheet not found")

    with pytest.raises(PluginError) as err:
        bootstrap(extra=[Exploding()], entry_points=False)

    assert str(err.value) == (
        "plugin 'Exploding' failed in ndplan_register_devices: RuntimeError: datasheet not found"
    )
    assert err.value.exit_code is ExitCode.PLUGIN_ERROR


def test_a_plugin_hook_raising_lines_is_one_line_error() -> None:
    # A message that spans lines (a plugin's own, a pydantic dump) broke the one line.
    class Multiline:
        @hookimpl
        def ndplan_register_devices(self, registry):
            raise RuntimeError("datasheet not found\n  looked in /etc/acme\n")

    class Incomplete:
        @hookimpl
        def ndplan_register_devices(self, registry):
            DeviceSpec(id="x2000", memory_gib=96, peak_tflops={"bf16": 1200.0})

    with pytest.raises(PluginError) as err:
        bootstrap(extra=[Multiline()], entry_points=False)
    assert str(err.value) == (
        "plugin 'Multiline' failed in ndplan_register_devices: RuntimeError: datasheet not "
        "found; looked in /etc/acme"
    )
    with pytest.raises(PluginError) as err:
        bootstrap(extra=[Incomplete()], entry_points=False)
    assert str(err.value) == (
        "plugin 'Incomplete' failed in ndplan_register_devices: device 'x2000': "
        "hbm_bandwidth_gb_per_s: Field required (and 3 more)"
    )


def test_a_plugin_with_a_misspelled_hook_is_refused() -> None:
    class Typo:
        @hookimpl
        def ndplan_register_device(self, registry):  # missing 's': pluggy would ignore it
            registry.add("typo-accel", device("typo-accel"))

    with pytest.raises(PluginError, match=r"plugin 'Typo' .*unknown hook 'ndplan_register_device'"):
        bootstrap(extra=[Typo()], entry_points=False)


def test_a_plugin_with_a_wrong_hook_signature_is_refused() -> None:
    class WrongArgs:
        @hookimpl
        def ndplan_register_devices(self, devices):
            pass

    with pytest.raises(PluginError, match=r"plugin 'WrongArgs' \(in-process\) could not register"):
        bootstrap(extra=[WrongArgs()], entry_points=False)


# --------------------------------------------------------------- disabling and order


def test_ndplan_disable_plugins_blocks_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "someone-else, FakeAccelPlugin")
    plugin = FakeAccelPlugin()

    comps = bootstrap(extra=[plugin], entry_points=False)

    assert [p.name for p in comps.plugins] == [BUILTIN_NAME]
    assert "fake-accel" not in comps.devices
    assert comps.refusal_rules.rules == []
    assert plugin.devices_seen is None  # its hooks never ran


def test_disabling_the_builtin_leaves_only_third_party_components(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", BUILTIN_NAME)

    comps = bootstrap(extra=[FakeAccelPlugin()], entry_points=False)

    assert list(comps.devices) == ["fake-accel"]
    assert len(comps.presets) == 0


def test_disabled_can_also_be_passed_explicitly() -> None:
    comps = bootstrap(extra=[FakeAccelPlugin()], disabled=["FakeAccelPlugin"], entry_points=False)
    assert "fake-accel" not in comps.devices


def test_user_plugins_are_asked_before_the_builtins() -> None:
    plugin = FakeAccelPlugin()
    bootstrap(extra=[plugin], entry_points=False)
    assert plugin.devices_seen == []  # no built-in device was registered yet

    pm, _ = make_plugin_manager(extra=[FakeAccelPlugin()], entry_points=False)
    for name in _spec_names():
        impls = getattr(pm.hook, name).get_hookimpls()
        call_order = [impl.plugin_name for impl in reversed(impls)]  # pluggy calls LIFO
        if BUILTIN_NAME in call_order:
            assert call_order[-1] == BUILTIN_NAME, name


def test_every_builtin_hook_is_trylast() -> None:
    pm, _ = make_plugin_manager(entry_points=False)
    impls = [
        impl
        for name in _spec_names()
        for impl in getattr(pm.hook, name).get_hookimpls()
        if impl.plugin_name == BUILTIN_NAME
    ]
    assert impls, "the built-in plugin implements no hook"
    assert all(impl.trylast for impl in impls)
    assert {impl.function for impl in impls} <= {
        getattr(builtin, impl.function.__name__) for impl in impls
    }


def test_each_bootstrap_builds_a_fresh_manager() -> None:
    first = bootstrap(extra=[FakeAccelPlugin()], entry_points=False)
    second = bootstrap(entry_points=False)
    assert "fake-accel" in first.devices
    assert "fake-accel" not in second.devices


# --------------------------------------------------------------- importable modules


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable plugin module, without touching the file system."""
    module = types.ModuleType("acme_ndplan_plugin")

    @hookimpl
    def ndplan_register_devices(registry):
        registry.add("acme-accel", device("acme-accel"))

    module.ndplan_register_devices = ndplan_register_devices  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_a_module_named_on_the_command_line_is_loaded(plugin_module: str) -> None:
    comps = bootstrap(plugins=[plugin_module], entry_points=False)

    assert comps.devices.entry("acme-accel").plugin == plugin_module
    assert comps.plugin_modules == (plugin_module,)
    (info,) = (p for p in comps.plugins if p.name == plugin_module)
    assert info.source == f"module {plugin_module}"


def test_a_module_named_in_ndplan_plugins_is_loaded(
    plugin_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NDPLAN_PLUGINS", f" {plugin_module} ,")
    comps = bootstrap(plugins=[plugin_module], entry_points=False)  # named twice, loaded once
    assert comps.plugin_modules == (plugin_module,)
    assert "acme-accel" in comps.devices


def test_a_module_that_does_not_import_is_a_plugin_error() -> None:
    with pytest.raises(PluginError, match=r"plugin module 'no\.such\.module' failed to import"):
        bootstrap(plugins=["no.such.module"], entry_points=False)


# --------------------------------------------------------------- entry points (faked)


@dataclass
class FakeDistribution:
    name: str
    version: str


@dataclass
class FakeEntryPoint:
    """What ``importlib.metadata.entry_points(group='ndplan')`` yields, as far as ndplan reads it."""

    name: str
    value: str
    target: object = None
    error: BaseException | None = None
    dist: FakeDistribution | None = None
    group: str = "ndplan"
    loads: list[str] = field(default_factory=list)

    def load(self) -> object:
        self.loads.append(self.name)
        if self.error is not None:
            raise self.error
        return self.target


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeEntryPoint]]:
    """The entry points 'installed' in group ``ndplan``; other groups are left real."""
    eps: list[FakeEntryPoint] = []
    real: Callable[..., Any] = manager.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        if params.get("group") == manager.ENTRY_POINT_GROUP:
            return list(eps)
        return real(**params)

    monkeypatch.setattr(manager.metadata, "entry_points", entry_points)
    yield eps


def _device_module(name: str, device_id: str) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def ndplan_register_devices(registry):
        registry.add(device_id, device(device_id))

    module.ndplan_register_devices = ndplan_register_devices  # type: ignore[attr-defined]
    return module


def test_an_entry_point_plugin_is_loaded_and_listed(installed: list[FakeEntryPoint]) -> None:
    module = _device_module("ndplan_fake", "ep-accel")
    installed.append(
        FakeEntryPoint(
            "fakedevices", "ndplan_fake", module, dist=FakeDistribution("ndplan-fake", "1.2.3")
        )
    )

    comps = bootstrap()

    assert comps.devices.entry("ep-accel").plugin == "fakedevices"
    (info,) = (p for p in comps.plugins if p.name == "fakedevices")
    assert info.source == "entry point ndplan-fake 1.2.3 (ndplan_fake)"
    assert info.hooks == ("ndplan_register_devices",)


def test_entry_points_load_in_name_order(installed: list[FakeEntryPoint]) -> None:
    order: list[str] = []
    for name in ("zeta", "alpha", "mid"):
        installed.append(
            FakeEntryPoint(name, f"{name}_mod", _device_module(name, f"{name}-x"), loads=order)
        )

    bootstrap()

    assert order == ["alpha", "mid", "zeta"]


def test_a_malformed_entry_point_is_a_plugin_error_naming_it(
    installed: list[FakeEntryPoint],
) -> None:
    installed.append(
        FakeEntryPoint(
            "broken",
            "ndplan_broken:plugin",
            error=ModuleNotFoundError("No module named 'ndplan_broken'"),
        )
    )

    with pytest.raises(PluginError) as err:
        bootstrap()

    assert str(err.value) == (
        "plugin 'broken' (ndplan_broken:plugin) failed to load: "
        "ModuleNotFoundError: No module named 'ndplan_broken'"
    )


def test_a_disabled_entry_point_is_never_loaded(
    installed: list[FakeEntryPoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = FakeEntryPoint("broken", "ndplan_broken:plugin", error=ImportError("nope"))
    installed.append(broken)
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "broken")

    comps = bootstrap()

    assert broken.loads == []
    assert [p.name for p in comps.plugins] == [BUILTIN_NAME]


def test_entry_points_can_be_skipped(installed: list[FakeEntryPoint]) -> None:
    broken = FakeEntryPoint("broken", "ndplan_broken", error=ImportError("nope"))
    installed.append(broken)
    bootstrap(entry_points=False)
    assert broken.loads == []


# --------------------------------------------------------------- through the CLI


def test_an_entry_point_device_shows_up_in_ndplan_devices(
    installed: list[FakeEntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    installed.append(
        FakeEntryPoint("fakedevices", "ndplan_fake", _device_module("ndplan_fake", "ep-accel"))
    )

    assert run(["devices", "--json"]) == ExitCode.OK
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["ep-accel"]["registered_by"] == "fakedevices"
    assert rows["ep-accel"]["memory_gib"] == 64.0
    assert rows["h100-sxm"]["registered_by"] == BUILTIN_NAME

    assert run(["devices"]) == ExitCode.OK
    table = capsys.readouterr().out
    (line,) = (ln for ln in table.splitlines() if "ep-accel" in ln)
    assert "fakedevices" in line


def test_an_entry_point_plugin_shows_up_in_ndplan_plugins(
    installed: list[FakeEntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    installed.append(
        FakeEntryPoint(
            "fakedevices",
            "ndplan_fake",
            _device_module("ndplan_fake", "ep-accel"),
            dist=FakeDistribution("ndplan-fake", "1.2.3"),
        )
    )

    assert run(["plugins", "--json"]) == ExitCode.OK
    listing = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in listing] == [BUILTIN_NAME, "fakedevices"]
    assert listing[1] == {
        "name": "fakedevices",
        "source": "entry point ndplan-fake 1.2.3 (ndplan_fake)",
        "hooks": ["ndplan_register_devices"],
        "registers": {"device": ["ep-accel"]},
    }
    assert listing[0]["registers"]["cost model"] == ["ndplan"]


def test_a_malformed_entry_point_exits_4_with_one_line_naming_it(
    installed: list[FakeEntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    installed.append(
        FakeEntryPoint("broken", "ndplan_broken:plugin", error=SyntaxError("invalid syntax"))
    )

    code = run(["plugins"])

    captured = capsys.readouterr()
    assert code == ExitCode.PLUGIN_ERROR == 4
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(
        "ndplan: error: plugin 'broken' (ndplan_broken:plugin) failed to load"
    )
    assert "Traceback" not in captured.err


def test_a_replacement_is_shown_in_ndplan_plugins(
    installed: list[FakeEntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    module = types.ModuleType("ndplan_derate")

    @hookimpl
    def ndplan_register_devices(registry):
        registry.add("h100-sxm", device("h100-sxm", memory_gib=70.0), replace=True)

    module.ndplan_register_devices = ndplan_register_devices  # type: ignore[attr-defined]
    installed.append(FakeEntryPoint("derate", "ndplan_derate", module))

    assert run(["plugins"]) == ExitCode.OK
    err = capsys.readouterr().err
    assert f"device 'h100-sxm': 'derate' replaces '{BUILTIN_NAME}'" in err


# --------------------------------------------------------------- built-in debug sinks


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_built_in_sink_that_fails_to_write_leaves_none_of_its_files(tmp_path, kind) -> None:
    from ndplan.adapters.sinks.files import CsvSink, JsonLinesSink

    sink = CsvSink() if kind == "csv" else JsonLinesSink()
    sink.open(tmp_path)
    sink.memory({"tp": 1}, {"total": 1.0})
    sink.time({"tp": 1}, {"step": 0.5})
    sink.refusal({"tp": 3}, "tp_divides_heads")
    (tmp_path / sink.files[-1]).mkdir()  # its last file cannot be written
    with pytest.raises(OSError):
        sink.close()
    # The CSV sink wrote debug_mem.csv and debug_perf.csv before it met the failure.
    assert [p.name for p in tmp_path.iterdir()] == [sink.files[-1]]


def test_a_built_in_sink_aborted_keeps_nothing(tmp_path) -> None:
    from ndplan.adapters.sinks.files import CsvSink

    aborted = CsvSink()
    aborted.open(tmp_path)
    aborted.memory({"tp": 1}, {"total": 1.0})
    aborted.abort()
    assert list(tmp_path.iterdir()) == []
    # Closed before another sink failed to: its files go when the run is aborted.
    closed = CsvSink()
    closed.open(tmp_path)
    closed.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(CsvSink.files)
    closed.abort()
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------- audit: replace, keys, disable


class ReplacesATypo:
    """Means to replace the built-in 'h100-sxm' but misspells it."""

    @hookimpl
    def ndplan_register_devices(self, registry):
        registry.add("h100-sxn", device("h100-sxn", memory_gib=70.0), replace=True)


def test_a_replacement_of_a_name_nobody_registers_is_a_plugin_error() -> None:
    # The third party's hook runs before the built-in's: judged once all registered.
    with pytest.raises(PluginError) as err:
        bootstrap(extra=[ReplacesATypo()], entry_points=False)
    assert str(err.value) == (
        "device 'h100-sxn' from 'ReplacesATypo' is registered with replace=True, but no other "
        "plugin registers 'h100-sxn': fix the name to replace one (did you mean h100-sxm, "
        "h100-pcie, h100-96gb?), or drop replace=True to add it as a new one"
    )


def test_a_replacement_of_nothing_is_a_warning_when_a_plugin_is_disabled(
    installed: list[FakeEntryPoint],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The disabled plugin may be the one that registers the name: not an error then."""
    installed.append(FakeEntryPoint("labdevices", "ndplan_lab", _device_module("l", "h100-sxn")))
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "labdevices")

    comps = bootstrap(extra=[ReplacesATypo()])

    assert comps.devices.entry("h100-sxn").plugin == "ReplacesATypo"
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: device 'h100-sxn' from 'ReplacesATypo' is registered with")
    assert "(unless disabled labdevices does)" in line


@pytest.mark.parametrize("replacer_first", [True, False])
def test_a_plugin_may_replace_a_name_another_third_party_registers(
    installed: list[FakeEntryPoint], replacer_first: bool
) -> None:
    replacer = types.ModuleType("ndplan_replacer")

    @hookimpl
    def ndplan_register_devices(registry):
        registry.add("lab-x", device("lab-x", memory_gib=70.0), replace=True)

    replacer.ndplan_register_devices = ndplan_register_devices  # type: ignore[attr-defined]
    names = ("a", "b") if replacer_first else ("b", "a")  # entry points load in name order
    installed.append(FakeEntryPoint(names[0], "ndplan_replacer", replacer))
    installed.append(FakeEntryPoint(names[1], "ndplan_lab", _device_module("lab", "lab-x")))

    entry = bootstrap().devices.entry("lab-x")

    assert (entry.plugin, entry.replaced, entry.value.memory_gib) == (names[0], names[1], 70.0)


def test_a_device_registered_under_a_name_other_than_its_id_is_refused() -> None:
    class Renamed:
        @hookimpl
        def ndplan_register_devices(self, registry):
            registry.add("x6000-renamed", device("x6000"))

    with pytest.raises(PluginError) as err:
        bootstrap(extra=[Renamed()], entry_points=False)
    assert str(err.value) == (
        "device 'x6000-renamed' from 'Renamed' has id 'x6000', so it would be listed as "
        "'x6000' but found only as 'x6000-renamed'; register it as its id: "
        "registry.add(spec.id, spec)"
    )


def test_a_disabled_name_that_is_no_plugin_is_a_warning(
    installed: list[FakeEntryPoint],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    installed.append(FakeEntryPoint("x1000", "ndplan_x1000", _device_module("x", "x1000")))
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "nosuch,x100")

    comps = bootstrap(extra=[FakeAccelPlugin()])

    assert "x1000" in comps.devices and "fake-accel" in comps.devices  # nothing disabled
    plugins = f"plugins: FakeAccelPlugin, {BUILTIN_NAME}, x1000 (module ndplan_x1000)"  # sorted
    assert capsys.readouterr().err.splitlines() == [
        f"warning: NDPLAN_DISABLE_PLUGINS names 'nosuch', which is no loaded or installed "
        f"plugin; {plugins}",
        f"warning: NDPLAN_DISABLE_PLUGINS names 'x100', which is no loaded or installed "
        f"plugin (did you mean x1000, ndplan_x1000?); {plugins}",
    ]


def test_a_disabled_name_that_matches_says_nothing(
    installed: list[FakeEntryPoint],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    installed.append(FakeEntryPoint("x1000", "ndplan_x1000", _device_module("x", "x1000")))
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", f"x1000,FakeAccelPlugin,{BUILTIN_NAME}")
    # An installed entry point matches even when entry points are not loaded.
    bootstrap(extra=[FakeAccelPlugin()], entry_points=False)
    bootstrap(extra=[FakeAccelPlugin()])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["ndplan_x1000", "ndplan_x1000:plugin"])
def test_an_entry_point_is_disabled_by_its_module_name(
    installed: list[FakeEntryPoint], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """docs/hooks.md: the entry-point name, the module name, or ndplan.builtin."""
    ep = FakeEntryPoint("x1000", value, _device_module("ndplan_x1000", "x1000"))
    installed.append(ep)
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "ndplan_x1000")

    comps = bootstrap()

    assert ep.loads == []
    assert [p.name for p in comps.plugins] == [BUILTIN_NAME]
    assert "x1000" not in comps.devices


@pytest.mark.parametrize("how", ["-p", "NDPLAN_PLUGINS"])
def test_a_module_also_installed_as_an_entry_point_loads_once_with_a_note(
    installed: list[FakeEntryPoint],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    module = _device_module("ndplan_x1000", "x1000")
    monkeypatch.setitem(sys.modules, "ndplan_x1000", module)
    installed.append(FakeEntryPoint("x1000", "ndplan_x1000", module))
    if how == "-p":
        comps = bootstrap(plugins=["ndplan_x1000"])
    else:
        monkeypatch.setenv("NDPLAN_PLUGINS", "ndplan_x1000")
        comps = bootstrap()

    assert [p.name for p in comps.plugins] == [BUILTIN_NAME, "x1000"]
    assert comps.devices.entry("x1000").plugin == "x1000"
    assert capsys.readouterr().err.splitlines() == [
        "note: plugin module 'ndplan_x1000' is already loaded as entry point 'x1000'; "
        "loading it once (drop it from -p or NDPLAN_PLUGINS)"
    ]


def test_one_object_under_two_plugin_names_is_one_line() -> None:
    class Twice:
        @hookimpl
        def ndplan_register_devices(self, registry):
            pass

    plugin = Twice()
    plugin.__name__ = "other"  # type: ignore[attr-defined]
    with pytest.raises(PluginError) as err:
        bootstrap(extra=[plugin, plugin], entry_points=False)
    assert str(err.value) == (
        "plugin 'other' (in-process) could not register: a plugin named 'other' (in-process) "
        "is already loaded; load one of them"
    )


def test_a_factory_raising_lines_is_one_line_naming_the_plugin() -> None:
    from ndplan.bootstrap import create
    from ndplan.core.ports import CostModel

    class Licensed:
        @hookimpl
        def ndplan_register_cost_models(self, registry):
            def factory(calibration):
                raise RuntimeError("licence server unreachable\n  host: lic.example\n")

            registry.add("licensed", factory)

    comps = bootstrap(extra=[Licensed()], entry_points=False)
    with pytest.raises(PluginError) as err:
        create(comps.cost_models, "licensed", CostModel, None)
    assert str(err.value) == (
        "cost model 'licensed' (from 'Licensed') could not be created: "
        "RuntimeError: licence server unreachable; host: lic.example"
    )
