"""Generate docs/hooks.md from src/plugins/hookspecs.py.

Run ``python docs/gen_hooks.py`` after changing a hook specification;
``python docs/gen_hooks.py --check`` exits 1 when the file on disk is stale
(tests/unit/test_architecture.py runs the same comparison).

The specs are read with ``ast``, not imported, so the script needs neither the
package installed nor pluggy; the section headings come from the
``# ---- name`` comments that group the specs in the source.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOKSPECS = ROOT / "src" / "plugins" / "hookspecs.py"
OUTPUT = ROOT / "docs" / "hooks.md"

SECTION = re.compile(r"^#\s*-{3,}\s*(?P<title>\S.*?)\s*$")

HEADER = """\
# Hook reference

<!-- Generated from src/plugins/hookspecs.py by docs/gen_hooks.py: do not edit by hand;
     change the specs and run `python docs/gen_hooks.py`. -->

{intro}

## Writing a plugin

A plugin is any module (or object) with functions named after the hooks below and
marked with `ndplan.plugins.hookspecs.hookimpl`. A distribution makes it visible to
every ndplan run through the entry-point group `ndplan`:

```toml
# pyproject.toml of your distribution
[project.entry-points.ndplan]
mydevices = "ndplan_mydevices"
```

```python
# ndplan_mydevices.py
from ndplan.core.cluster import DeviceSpec
from ndplan.plugins.hookspecs import hookimpl


@hookimpl
def ndplan_register_devices(registry):
    spec = DeviceSpec(
        id="lab-accel",
        name="Lab Accelerator 96GB",
        aliases=("Lab Accel",),
        memory_gib=96,
        peak_tflops={{"bf16": 800, "fp8": 1600}},
        hbm_bandwidth_gb_per_s=4000,
        scale_up={{"bandwidth_gb_per_s": 450, "domain_size": 8}},
        scale_out={{"bandwidth_gb_per_s": 50}},
        host_link={{"bandwidth_gb_per_s": 64}},
    )
    registry.add(spec.id, spec, aliases=spec.aliases)
```

Install it (`pip install .`) and `ndplan devices` lists `lab-accel` with `mydevices` in
its plugin column; `ndplan plugins` shows where it came from.

Other ways in: `ndplan -p package.module …` or `NDPLAN_PLUGINS=package.module` for an
importable module, and `bootstrap(extra=[obj])` for an object in the same process
(tests). `NDPLAN_DISABLE_PLUGINS=name,other` blocks plugins by name (the entry-point
name, the module name, or `ndplan.builtin`). `ndplan plugins` lists what loaded,
where it came from and the hooks it implements, and which built-in each replaced.

Rules that hold for every hook:

- A name is registered once. Registering a name another plugin registered is a plugin
  error naming both; to replace a built-in, pass `replace=True`. The replacement wins
  whatever order the hooks ran in, and the listings show whom it replaced.
- Built-in implementations are `trylast`: a third-party plugin is asked first.
- A plugin that fails to import, implements a hook that does not exist, or raises in a
  hook stops the run with one line naming it (exit code 4).

## Hooks

| hook | group | what it is for |
|---|---|---|
{table}
"""


@dataclass(frozen=True)
class Hook:
    name: str
    signature: str
    options: tuple[str, ...]
    doc: str
    section: str

    @property
    def summary(self) -> str:
        return self.doc.split("\n\n", 1)[0].replace("\n", " ")


def rst_to_markdown(text: str) -> str:
    """The little reStructuredText the specs use, as Markdown."""
    text = re.sub(r":(?:class|func|meth|mod|attr|data|exc):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _is_hookspec(decorator: ast.expr) -> tuple[bool, tuple[str, ...]]:
    """Whether ``decorator`` is ``@hookspec`` or ``@hookspec(...)``, and its options."""
    if isinstance(decorator, ast.Name) and decorator.id == "hookspec":
        return True, ()
    if (
        isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Name)
        and decorator.func.id == "hookspec"
    ):
        options = tuple(
            f"{kw.arg}={ast.unparse(kw.value)}" for kw in decorator.keywords if kw.arg is not None
        )
        return True, options
    return False, ()


def read_hooks(source: str) -> tuple[str, list[Hook]]:
    """The module docstring and every hook spec, in source order, with its section."""
    tree = ast.parse(source)
    sections: list[tuple[int, str]] = [
        (lineno, m["title"])
        for lineno, line in enumerate(source.splitlines(), start=1)
        if (m := SECTION.match(line.strip()))
    ]
    hooks = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            is_spec, options = _is_hookspec(decorator)
            if is_spec:
                break
        else:
            continue
        first_line = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        before = [title for lineno, title in sections if lineno < first_line]
        hooks.append(
            Hook(
                name=node.name,
                signature=f"{node.name}({ast.unparse(node.args)})",
                options=options,
                doc=inspect.cleandoc(ast.get_docstring(node) or "(undocumented)"),
                section=before[-1] if before else "hooks",
            )
        )
    return inspect.cleandoc(ast.get_docstring(tree) or ""), hooks


def _render_doc(doc: str) -> str:
    """A spec's docstring: prose as paragraphs, ``:param x:`` fields as a list after it."""
    prose: list[str] = []
    fields: list[list[str]] = []
    in_field = False
    for line in doc.splitlines():
        param = re.match(r":param\s+(\w+):\s*(.*)", line)
        returns = re.match(r":returns?:\s*(.*)", line)
        if param:
            fields.append([f"- `{param[1]}`: {param[2]}"])
        elif returns:
            fields.append([f"- returns: {returns[1]}"])
        elif in_field and line[:1].isspace() and line.strip():
            fields[-1].append(line.strip())
            continue
        else:
            prose.append(line)
        in_field = bool(param or returns)
    text = "\n".join(prose).strip()
    if fields:
        items = "\n".join(" ".join(f) for f in fields)
        text = f"{text}\n\n{items}" if text else items
    return rst_to_markdown(text)


def render(source: str | None = None) -> str:
    """The whole of docs/hooks.md for the given hookspecs source (the file on disk by default)."""
    if source is None:
        source = HOOKSPECS.read_text(encoding="utf-8")
    intro, hooks = read_hooks(source)
    table = "\n".join(
        f"| [`{h.name}`](#{h.name}) | {h.section} | {rst_to_markdown(h.summary)} |" for h in hooks
    )
    parts = [HEADER.format(intro=rst_to_markdown(intro), table=table)]
    section = None
    for hook in hooks:
        if hook.section != section:
            section = hook.section
            parts.append(f"\n## {section.capitalize()}\n")
        options = (
            f"\n\nOptions: {', '.join(f'`{o}`' for o in hook.options)}." if hook.options else ""
        )
        parts.append(
            f'\n<a id="{hook.name}"></a>\n\n### `{hook.signature}`\n\n'
            f"{_render_doc(hook.doc)}{options}\n"
        )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/hooks.md is out of date"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python docs/gen_hooks.py")
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
