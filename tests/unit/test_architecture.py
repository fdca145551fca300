"""The architecture holds: core imports nothing of ours, compiles nothing on import,
and every hook is documented (docs/hooks.md, generated) and exercised (the meta-test)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from ndplan.bootstrap import bootstrap
from ndplan.plugins import builtin, hookspecs

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
CORE = SRC / "core"
TESTS = REPO / "tests"
DOCS = REPO / "docs"

OUTER_LAYERS = ("ndplan.adapters", "ndplan.plugins", "ndplan.cli", "ndplan.bootstrap")


# --------------------------------------------------------------- core imports nothing of ours


def module_name(path: Path) -> str:
    """``src/core/kernels/knapsack.py`` -> ``ndplan.core.kernels.knapsack``."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["ndplan", *parts])


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every absolute module (and ``module.name``) a source imports, anywhere in it."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def violations(names: set[str]) -> list[str]:
    return sorted(
        n for n in names if n in OUTER_LAYERS or n.startswith(tuple(f"{o}." for o in OUTER_LAYERS))
    )


def test_the_import_checker_resolves_relative_imports() -> None:
    source = (
        "from .. import adapters\n"
        "from ..plugins.registry import Registry\n"
        "from . import units\n"
        "import ndplan.cli.app\n"
        "def f():\n"
        "    from ndplan import bootstrap\n"
    )
    names = imported_names(source, "ndplan.core.layout", is_package=False)
    assert "ndplan.core.units" in names
    assert violations(names) == [
        "ndplan.adapters",
        "ndplan.bootstrap",
        "ndplan.cli.app",
        "ndplan.plugins.registry",
        "ndplan.plugins.registry.Registry",
    ]
    # In a package's __init__, one dot is the package itself.
    assert "ndplan.core.kernels.reference" in imported_names(
        "from .reference import x", "ndplan.core.kernels", is_package=True
    )


def test_core_imports_nothing_from_the_outer_layers() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 5
    found = {}
    for path in files:
        names = imported_names(
            path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"
        )
        if bad := violations(names):
            found[str(path.relative_to(REPO))] = bad
    assert found == {}, f"core must not import adapters, plugins, cli or bootstrap: {found}"


@pytest.mark.parametrize("statement", ["import ndplan", "import ndplan.core"])
def test_importing_the_package_does_not_import_numba(statement: str) -> None:
    """`import ndplan` compiles nothing: only the kernel modules import numba, lazily."""
    code = f"{statement}\nimport sys\nprint('numba' in sys.modules, 'llvmlite' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "False"]


# --------------------------------------------------------------- hooks: documented and exercised


def hook_specs() -> dict[str, types.FunctionType]:
    return {
        name: fn
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, "ndplan_spec")
    }


def load_generator() -> types.ModuleType:
    """docs/gen_hooks.py, a script rather than a module of the package."""
    name = "_ndplan_docs_gen_hooks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / "gen_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def test_there_are_hooks() -> None:
    assert "ndplan_register_devices" in hook_specs()
    assert len(hook_specs()) >= 10


def test_hooks_md_is_generated_from_the_current_hookspecs() -> None:
    expected = load_generator().render()
    actual = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert actual == expected, (
        "docs/hooks.md is out of date with src/plugins/hookspecs.py: run python docs/gen_hooks.py"
    )


def test_the_generator_sees_every_hook_with_its_section() -> None:
    _, hooks = load_generator().read_hooks((SRC / "plugins" / "hookspecs.py").read_text())
    assert sorted(h.name for h in hooks) == sorted(hook_specs())
    sections = {h.name: h.section for h in hooks}
    assert sections["ndplan_register_devices"] == "inputs"


def test_the_generator_follows_a_changed_spec() -> None:
    """Editing hookspecs without regenerating is caught: the render depends on the source."""
    gen = load_generator()
    source = (SRC / "plugins" / "hookspecs.py").read_text()
    changed = source + (
        "\n\n# ---------------------------------------------------- reporting\n\n\n"
        "@hookspec(firstresult=True)\n"
        "def ndplan_pick_report(plans, context):\n"
        '    """Choose a report.\n\n    :param plans: ``Plan`` objects.\n    """\n'
    )
    text = gen.render(changed)
    assert text != gen.render(source)
    assert "## Reporting" in text
    assert "### `ndplan_pick_report(plans, context)`" in text
    assert "- `plans`: `Plan` objects." in text
    assert "Options: `firstresult=True`." in text


@pytest.mark.parametrize("name", sorted(hook_specs()))
def test_every_hook_is_documented_with_its_summary(name: str) -> None:
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    fn = hook_specs()[name]
    summary = inspect.getdoc(fn).split("\n\n")[0].replace("\n", " ").replace("``", "`")
    params = ", ".join(inspect.signature(fn).parameters)
    assert f"### `{name}({params})`" in text
    assert summary in text


@pytest.mark.parametrize("name", sorted(hook_specs()))
def test_every_hook_is_implemented_by_the_builtin_or_exercised_by_a_test(name: str) -> None:
    if hasattr(builtin, name):
        return
    # A test exercises a hook by implementing it in a plugin it loads (this file excluded).
    this = Path(__file__).resolve()
    users = [
        p.relative_to(REPO)
        for p in TESTS.rglob("*.py")
        if p.resolve() != this and re.search(rf"\bdef {name}\(", p.read_text(encoding="utf-8"))
    ]
    assert users, f"{name}: neither the built-in plugin nor any test implements it"


def test_the_documented_plugin_example_works() -> None:
    """The example in docs/hooks.md registers its device when loaded as a plugin."""
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "@hookimpl" in b]
    plugin = types.ModuleType("ndplan_mydevices")
    exec(compile(code, "docs/hooks.md", "exec"), plugin.__dict__)

    comps = bootstrap(extra=[plugin], entry_points=False)

    entry = comps.devices.entry("Lab Accel")
    assert (entry.name, entry.plugin) == ("lab-accel", "ndplan_mydevices")


def test_the_extension_examples_in_architecture_md_work(tmp_path: Path) -> None:
    """Every plugin example on the architecture page loads and registers what it says."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "@hookimpl" in b]
    plugins = []
    for i, code in enumerate(blocks):
        plugin = types.ModuleType(f"architecture_example_{i}")
        exec(compile(textwrap.dedent(code), f"docs/architecture.md#{i}", "exec"), plugin.__dict__)
        plugins.append(plugin)

    comps = bootstrap(extra=plugins, entry_points=False)

    names = {p.__name__ for p in plugins}
    assert comps.devices.entry("lab accel").plugin in names
    assert comps.readers.entry("myframework").plugin in names
    assert comps.debug_sinks.entry("stderr-jsonl").plugin in names
    cost = comps.cost_models.entry("ndplan")
    assert (cost.plugin in names, cost.replaced) == (True, "ndplan.builtin")

    (device_file,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (tmp_path / "lab.yaml").write_text(textwrap.dedent(device_file))
    from_file = bootstrap(device_files=[tmp_path / "lab.yaml"], entry_points=False)
    assert from_file.devices.get("lab-accel") == comps.devices.get("lab-accel")
