"""The ``ndplan`` command line: parse, bootstrap, call the core, render.

Exit codes (spec/interfaces.md): 0 ok, 1 no feasible plan, 2 usage (click's own,
for malformed flags), 3 invalid input, 4 plugin error, 5 internal error,
130 interrupted. Known errors print one line on stderr; a traceback only with
``NDPLAN_DEBUG=1``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import traceback
from typing import Annotated

import typer
from typer.core import TyperGroup

from ndplan import __version__
from ndplan.core.errors import ExitCode, NdplanError
from ndplan.plugins.manager import report_diagnostics_to

from . import compare, estimate, info, interrupts, models, output, search, sweep
from .options import State, state


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Click's exception base, wherever this typer takes click from (vendored or not)."""
    types: list[type[BaseException]] = []
    try:
        from typer.exceptions import TyperException

        types.append(TyperException)
    except ImportError:
        pass
    try:
        from click import ClickException

        types.append(ClickException)
    except ImportError:
        pass
    return tuple(types)


class _Commands(TyperGroup):
    """The command group, with a closed stdout met outside ndplan's own writers (a
    plugin's debug sink printing records, `| head`) taken as the reader leaving, as
    ndplan's writers take it; click would exit 1 without a word."""

    def invoke(self, ctx: typer.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # Only stdout's reader leaving is the user's doing; a pipe to a worker that
            # broke is a fault and keeps its error.
            if output.stdout_reader_gone():
                raise output.OutputClosed from None
            raise


app = typer.Typer(
    name="ndplan",
    cls=_Commands,
    help="Plan N-dimensional parallelism for LLM training: search every layout, price it "
    "analytically (memory and step time), rank what fits.",
    pretty_exceptions_enable=False,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        output.write_stdout(f"ndplan {__version__}\n")  # a closed pipe is no error here either
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            "-p",
            metavar="MODULE",
            help="Load an importable module as a plugin (repeatable; also NDPLAN_PLUGINS).",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            show_default=False,
            help="More diagnostics: -v names the executor and its workers; -vv adds a line "
            "per priced candidate (and prices in one process).",
        ),
    ] = 0,
    quiet: Annotated[
        int,
        typer.Option(
            "--quiet",
            "-q",
            count=True,
            show_default=False,
            help="Fewer diagnostics: -q drops notes (the assumed: line), -qq warnings too.",
        ),
    ] = 0,
) -> None:
    st = state(ctx)
    st.plugins = list(plugin or [])
    st.verbosity = verbose - quiet
    output.set_verbosity(st.verbosity)
    # Plugin loading's warnings and notes obey -q/-qq as the CLI's own do.
    report_diagnostics_to(output.note)


info.register(app)
estimate.register(app)
compare.register(app)
search.register(app)
models.register(app)
sweep.register(app)


def _fail(message: str, code: ExitCode) -> int:
    print(f"ndplan: error: {message}", file=sys.stderr)
    return int(code)


def _interrupted(exc: BaseException) -> bool:
    """Whether Ctrl-C caused ``exc``. Fix (tests/integration/test_search_interrupt.py): a
    KeyboardInterrupt that lands inside a numba kernel (the knapsack) comes out as
    ``SystemError: ... returned a result with an exception set`` caused by it, which the
    pricing guard then reported as an internal error (exit 5) instead of exit 130."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


DIMENSION_WORD = re.compile(r"[A-Za-z]+(,[A-Za-z]+)*")
"""A word -l/--vary folds: a name or a comma list of names (not a path or a number)."""


def join_vary_words(argv: list[str]) -> list[str]:
    """``-l TP PP CP`` as users type it: fold the dimension names that follow -l/--vary
    into one value (click options take one word each). Every name-like word is folded,
    known or not: ``search`` takes no positional argument, so a misspelt dimension
    (``-l TP PP OFLOAD``) meets the unknown-dimension error that names the choices,
    not click's "unexpected extra argument"."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        out.append(argv[i])
        if argv[i] in ("-l", "--vary") and i + 1 < len(argv):
            words = [argv[i + 1]]
            i += 2
            while i < len(argv) and DIMENSION_WORD.fullmatch(argv[i]):
                words.append(argv[i])
                i += 1
            out.append(",".join(words))
            continue
        i += 1
    return out


def expand_attached_home(argv: list[str]) -> list[str]:
    """``--ranking-csv=~/r.csv`` as the shell reads ``--ranking-csv ~/r.csv``: a shell
    expands ``~`` only at the start of a word, so the attached form reached ndplan as a
    literal ``~`` and wrote into a folder of that name. An unknown user stays literal."""
    out = []
    for word in argv:
        flag, sep, value = word.partition("=")
        if sep and flag.startswith("--") and value.startswith("~"):
            with contextlib.suppress(RuntimeError):  # ~nobody: left for the reader to refuse
                word = f"{flag}={os.path.expanduser(value)}"
        out.append(word)
    return out


ROOT_FLAG = re.compile(r"-(v+|q+)|--verbose|--quiet")
"""The root's verbosity flags as they may follow the command (``-qq`` counts twice)."""


def _options_taking_values(command) -> tuple[set[str], set[str]]:
    """(names of ``command``'s options that take a value, all its option names). Duck-typed:
    typer may bring its own copy of click (see ``_usage_error_types``)."""
    options = [p for p in command.params if p.param_type_name == "option"]
    every = {name for p in options for name in (*p.opts, *p.secondary_opts)}
    valued = {name for p in options if not (p.is_flag or p.count) for name in p.opts}
    return valued, every


def hoist_root_flags(argv: list[str]) -> list[str]:
    """``ndplan search … -q`` as users type it: the root's -v/-q given after the command
    move to the front (click takes a group's options only before its command). The value
    of a command's option stays (``--space -q`` names a file), so does a flag the command
    defines itself, and so does everything after ``--``."""
    if not any(ROOT_FLAG.fullmatch(word) for word in argv):
        return argv  # the common case, without building the command tree
    root = command = typer.main.get_command(app)
    valued, own = _options_taking_values(command)
    kept: list[str] = []
    hoisted: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            kept.extend(argv[i:])
            break
        if word in valued:
            kept.extend(argv[i : i + 2])
            i += 2
            continue
        if word in getattr(command, "commands", ()):  # a (sub)command of a group
            command = command.commands[word]
            valued, own = _options_taking_values(command)
            kept.append(word)
        elif command is not root and word not in own and ROOT_FLAG.fullmatch(word):
            hoisted.append(word)
        else:
            kept.append(word)
        i += 1
    return hoisted + kept


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; never raises (NDPLAN_DEBUG=1 adds tracebacks)."""
    debug = os.environ.get("NDPLAN_DEBUG") == "1"
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = hoist_root_flags(join_vary_words(expand_attached_home(argv)))
    run_state = State()  # kept here: a failure is traced to the plugins this run loaded
    try:
        with interrupts.guarded():
            result = app(args=argv, prog_name="ndplan", standalone_mode=False, obj=run_state)
            interrupts.check()  # a Ctrl-C that a C callback swallowed on the way
    except typer.Exit as exc:
        # Fix: typer turns Ctrl-C into Exit(130) (from the KeyboardInterrupt), which
        # returned 130 silently; say so in one line, as every other way out does.
        if _interrupted(exc):
            return _fail("interrupted", ExitCode.INTERRUPTED)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return _fail("interrupted", ExitCode.INTERRUPTED)
    except _usage_error_types() as exc:  # malformed flags: click's own message and exit 2
        exc.show()  # type: ignore[attr-defined]
        return exc.exit_code  # type: ignore[attr-defined]
    except output.StdoutFailed as exc:
        output.drop_unwritten_stdout()
        _stdout_to_devnull()  # the interpreter's last flush would meet the same failure
        return _fail(str(exc), exc.exit_code)
    except NdplanError as exc:
        if _interrupted(exc):
            return _fail("interrupted", ExitCode.INTERRUPTED)
        if debug:
            traceback.print_exc()
        return _fail(str(exc), exc.exit_code)
    except output.OutputClosed:
        # The reader left (`ndplan models | head -1`): not an error. stdout now points at
        # nothing, or the interpreter's last flush meets the closed pipe and exits 1.
        _stdout_to_devnull()
        return 0
    except Exception as exc:
        if _interrupted(exc):
            return _fail("interrupted", ExitCode.INTERRUPTED)
        if debug:  # the traceback, but still the documented code (not Python's 1)
            traceback.print_exc()
        # Code a plugin supplied (a cost model's method, a sink's write) raised outside the
        # search's own per-candidate guard: the plugin's fault (exit 4), named.
        from ndplan.adapters.executors.faults import blame

        found = blame(exc, run_state.loaded_plugin_modules())
        if found is not None:
            return _fail(found.message(exc), ExitCode.PLUGIN_ERROR)
        return _fail(
            f"internal error: {type(exc).__name__}: {exc} (rerun with NDPLAN_DEBUG=1 "
            "for a traceback)",
            ExitCode.INTERNAL_ERROR,
        )
    if result == ExitCode.INTERRUPTED:
        # Fix: without standalone mode click hands typer's Exit(130) back as the result
        # (Ctrl-C anywhere in a command), which returned 130 without a word.
        return _fail("interrupted", ExitCode.INTERRUPTED)
    return int(result) if isinstance(result, int) else 0


def _stdout_to_devnull() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stdout (tests) has no fd
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main() -> None:
    """The ``ndplan`` process: one command, then exit.

    Python's cyclic garbage collector stays off for the process. Its passes walk every
    live object (numba's type registries alone hold hundreds of thousands, and a
    search's caches as many again) and free next to nothing: a search allocates no
    reference cycles (see ``collector_paused``). Llama-3-70B on 1,024 H100: 1 s of a
    4 s command went to them, 0.5 s of it at interpreter shutdown, which
    ``gc.freeze`` spares; an 18-scenario sweep peaks at the same memory either way.
    """
    gc.disable()
    code = run()
    gc.freeze()
    sys.exit(code)
