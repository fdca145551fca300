"""Documented exit codes and one-line errors (spec/interfaces.md, 'Command line').

0 ok, 1 no feasible plan, 2 usage (click's own), 3 invalid input, 4 plugin error,
5 internal error, 130 interrupted. Known errors are one line on stderr; a traceback
only with NDPLAN_DEBUG=1.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ndplan import __version__
from ndplan.cli.app import app, run
from ndplan.cli.options import State, Strict
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.errors import (
    ExitCode,
    InfeasibleError,
    InternalError,
    InvalidInputError,
    NdplanError,
    PluginError,
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG"):
        monkeypatch.delenv(var, raising=False)


def one_error_line(err: str) -> str:
    """The single stderr line of a known error."""
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("ndplan: error: ")
    return lines[0]


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[..., None]], None]:
    """Adds a throwaway ``probe`` command to the app for this test only."""
    monkeypatch.setattr(app, "registered_commands", list(app.registered_commands))

    def install(fn: Callable[..., None]) -> None:
        app.command("probe")(fn)

    return install


def test_the_documented_codes() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0,
        "NO_FEASIBLE_PLAN": 1,
        "USAGE": 2,
        "INVALID_INPUT": 3,
        "PLUGIN_ERROR": 4,
        "INTERNAL_ERROR": 5,
        "INTERRUPTED": 130,
    }


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == ExitCode.OK
    assert capsys.readouterr().out == f"ndplan {__version__}\n"


@pytest.mark.parametrize("name", ["Layout", "layout"])
def test_a_known_schema_prints_json(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert run(["schema", name]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["title"] == "Layout"


def test_an_unknown_schema_is_invalid_input_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["schema", "Layuot"]) == ExitCode.INVALID_INPUT == 3

    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_error_line(captured.err)
    assert "unknown schema 'Layuot'" in line
    assert "Layout" in line  # the known names are listed


@pytest.mark.parametrize(
    "argv",
    [["--bogus"], ["schema", "--bogus"], ["devices", "--json=maybe"], ["no-such-command"]],
    ids=["root-flag", "command-flag", "flag-value", "command"],
)
def test_malformed_flags_are_click_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == ExitCode.USAGE == 2
    err = capsys.readouterr().err
    assert "Error:" in err  # click's own message
    assert "Traceback" not in err


def test_an_unknown_plugin_module_is_a_plugin_error_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["-p", "no.such.module", "plugins"]) == ExitCode.PLUGIN_ERROR == 4

    line = one_error_line(capsys.readouterr().err)
    assert "plugin module 'no.such.module' failed to import" in line


def _explode(self: State, *args: object, **kwargs: object) -> None:
    raise RuntimeError("the registry caught fire")


def test_an_internal_error_is_one_line_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(State, "components", _explode)

    assert run(["plugins"]) == ExitCode.INTERNAL_ERROR == 5

    line = one_error_line(capsys.readouterr().err)
    assert "internal error: RuntimeError: the registry caught fire" in line
    assert "NDPLAN_DEBUG=1" in line  # says how to get the traceback


def test_ndplan_debug_adds_the_traceback_and_keeps_the_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(State, "components", _explode)
    monkeypatch.setenv("NDPLAN_DEBUG", "1")

    assert run(["plugins"]) == ExitCode.INTERNAL_ERROR

    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "in _explode" in err
    assert err.rstrip().splitlines()[-1].startswith("ndplan: error: internal error")


def test_ndplan_debug_shows_the_traceback_of_a_known_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NDPLAN_DEBUG", "1")

    assert run(["schema", "Nope"]) == ExitCode.INVALID_INPUT

    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "InvalidInputError" in err


def _interrupt(self: State, *args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_exits_130_not_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(State, "components", _interrupt)

    assert run(["devices"]) == ExitCode.INTERRUPTED == 130

    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InfeasibleError("no layout fits: the closest needs 91.2 GiB of 80"), 1),
        (InvalidInputError("seq_len: must be positive, got -1"), 3),
        (PluginError("plugin 'x' failed"), 4),
        (InternalError("a bug"), 5),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, NdplanError) else str(v),
)
def test_each_known_error_maps_to_its_code(
    error: NdplanError,
    code: int,
    probe: Callable[[Callable[..., None]], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    def raises() -> None:
        raise error

    probe(raises)

    assert run(["probe"]) == code == error.exit_code
    assert one_error_line(capsys.readouterr().err) == f"ndplan: error: {error.message}"


def test_a_strict_run_refuses_to_assume_a_field(
    probe: Callable[[Callable[..., None]], None], capsys: pytest.CaptureFixture[str]
) -> None:
    def assumes(strict: Strict = False) -> None:
        recorder = AssumptionRecorder(strict=strict)
        recorder.default("seq_len", 4096, "job defaults")
        print(recorder.line())

    probe(assumes)

    assert run(["probe"]) == ExitCode.OK
    assert capsys.readouterr().out == "assumed: seq_len=4096 (job defaults)\n"

    assert run(["probe", "--strict"]) == ExitCode.INVALID_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_error_line(captured.err)
    assert line.startswith("ndplan: error: seq_len: not stated")
    assert "--strict" in line and "4096" in line


# --------------------------------------------------------------- device files

GOOD_DEVICE = """\
id: lab-accel
memory_gib: 48
peak_tflops: {bf16: 300}
hbm_bandwidth_gb_per_s: 1800
scale_up: {bandwidth_gb_per_s: 150}
scale_out: {bandwidth_gb_per_s: 25}
host_link: {bandwidth_gb_per_s: 32}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD_DEVICE.replace("memory_gib: 48", "memory_gib: -48"),
            "device 'lab-accel': memory_gib: Input should be greater than 0",
        ),
        (
            GOOD_DEVICE.replace("hbm_bandwidth_gb_per_s: 1800\n", ""),
            "device 'lab-accel': hbm_bandwidth_gb_per_s: Field required",
        ),
        (
            GOOD_DEVICE.replace("{bf16: 300}", "{fp32: 60}"),
            "device 'lab-accel': peak_tflops needs a bf16 or fp16 rate",
        ),
        (
            GOOD_DEVICE + "colour: red\n",
            "device 'lab-accel': colour: Extra inputs are not permitted",
        ),
        ("id: [unclosed\n", "not valid YAML/JSON"),
        ("- just a string\n", "device 0 is not a mapping"),
    ],
    ids=[
        "negative-memory",
        "missing-key",
        "no-training-rate",
        "unknown-key",
        "bad-yaml",
        "not-a-mapping",
    ],
)
def test_an_invalid_device_file_is_invalid_input_naming_the_field(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)

    assert run(["devices", "--device-file", str(bad)]) == ExitCode.INVALID_INPUT

    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_error_line(captured.err)
    assert line.startswith(f"ndplan: error: {bad}: ")
    assert expected in line


def test_a_missing_device_file_is_invalid_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.yaml"
    assert run(["devices", "--device-file", str(missing)]) == ExitCode.INVALID_INPUT
    assert "cannot read the device file" in one_error_line(capsys.readouterr().err)


def test_a_valid_device_file_adds_its_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "lab.yaml"
    good.write_text(GOOD_DEVICE)

    assert run(["devices", "--json", "--device-file", str(good)]) == ExitCode.OK
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["lab-accel"]["registered_by"] == f"device-file:{good}"
    assert "h100-sxm" in rows


def test_a_devices_json_entry_is_a_device_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Copying a catalog entry from `devices --json` and editing it is how a user writes a
    device file: its listing fields (registered_by, replaced) are read past, not refused."""
    assert run(["devices", "--json"]) == ExitCode.OK
    h100 = next(d for d in json.loads(capsys.readouterr().out) if d["id"] == "h100-sxm")
    lab = tmp_path / "lab.json"
    lab.write_text(json.dumps({**h100, "id": "lab-h100", "aliases": [], "memory_gib": 96}))
    assert run(["devices", "--json", "--device-file", str(lab)]) == ExitCode.OK
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["lab-h100"]["memory_gib"] == 96
    assert rows["lab-h100"]["registered_by"] == f"device-file:{lab}"
    assert {
        k: v for k, v in rows["lab-h100"].items() if k not in ("id", "memory_gib", "registered_by")
    } == {
        k: v for k, v in h100.items() if k not in ("id", "aliases", "memory_gib", "registered_by")
    } | {"aliases": []}


# --------------------------------------------------------------- end to end


def _ndplan_command() -> list[str]:
    """The installed console script next to this interpreter, else the same entry function."""
    script = Path(sys.executable).with_name("ndplan")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from ndplan.cli.app import main; main()"]


def test_python_dash_m_is_the_same_command_line() -> None:
    """``python -m ndplan`` behaves as the ``ndplan`` script: the version, and a bad
    input's one line and exit 3."""
    version = subprocess.run(
        [sys.executable, "-m", "ndplan", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (version.returncode, version.stdout) == (0, f"ndplan {__version__}\n")
    argv = ["search", "-m", "no-such-model", "-d", "h100", "-n", "8", "--gbs", "8", "-s", "1024"]
    bad = subprocess.run(
        [sys.executable, "-m", "ndplan", *argv], capture_output=True, text=True, timeout=60
    )
    assert (bad.returncode, bad.stdout) == (3, "")
    assert bad.stderr.startswith("ndplan: error: unknown model preset 'no-such-model'")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_the_console_script_exit_codes() -> None:
    version = subprocess.run(
        [*_ndplan_command(), "--version"], capture_output=True, text=True, timeout=60
    )
    assert (version.returncode, version.stdout) == (0, f"ndplan {__version__}\n")

    malformed = subprocess.run(
        [*_ndplan_command(), "schema", "--frobnicate"], capture_output=True, text=True, timeout=60
    )
    assert malformed.returncode == 2
    assert malformed.stdout == ""
    assert "No such option: --frobnicate" in malformed.stderr
    assert "Traceback" not in malformed.stderr


@pytest.mark.parametrize(
    "argv",
    [["models"], ["models", "--json"], ["schema", "Job"], ["--version"]],
    ids=["table", "json", "schema", "version"],
)
def test_a_reader_that_leaves_early_is_not_an_error(argv: list[str]) -> None:
    """``ndplan models | head -1``: the reader closes the pipe; the command stops writing
    and exits 0 without a word, whether it prints a table (rich) or JSON; before, a table
    exited 1, the code of "no feasible plan"."""
    done = run_with_stdout_closed(argv)
    assert (done.returncode, done.stderr) == (0, "")


def run_with_stdout_closed(
    argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m ndplan ARGV`` with stdout a pipe no one reads: the first write meets
    a closed pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "ndplan", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        os.close(write_end)


def test_a_plugin_printing_to_a_stdout_whose_reader_left_is_not_an_error(tmp_path: Path) -> None:
    """A debug sink that prints its records (docs/architecture.md's example), piped to
    ``head``: the plugin's own print meets the closed pipe; the run still ends as any
    reader leaving does, exit 0 in silence, where click exited 1 without a word."""
    (tmp_path / "printing_sink.py").write_text(
        "from ndplan.plugins.hookspecs import hookimpl\n"
        "class Printing:\n"
        "    name = 'printing'\n"
        "    def open(self, directory): pass\n"
        "    def memory(self, candidate, parts): print(candidate)\n"
        "    def time(self, candidate, parts): print(candidate)\n"
        "    def refusal(self, candidate, reason): print(candidate, reason)\n"
        "    def close(self): pass\n"
        "@hookimpl\n"
        "def ndplan_register_debug_sinks(registry):\n"
        "    registry.add('printing', Printing)\n"
    )
    argv = ["-q", "-p", "printing_sink", "search", "-m", "llama-3-8b", "-d", "h100", "-n", "8"]
    argv += ["--gbs", "16", "-s", "2048", "--debug-sink", "printing", "-j", "1"]
    done = run_with_stdout_closed(argv, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert (done.returncode, done.stderr) == (0, "")


class _FullDisk:
    """A stdout on a full disk: every write fails as the kernel's ENOSPC does."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize(
    "argv", [["models"], ["models", "--json"], ["--version"]], ids=["table", "json", "version"]
)
def test_a_stdout_that_cannot_be_written_is_one_line_not_an_internal_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """``ndplan models > /dev/full``: before, exit 5 and "internal error: OSError …
    (rerun with NDPLAN_DEBUG=1 …)", as if ndplan had a bug; a full disk is the output's
    own failure, as for a result file (exit 3)."""
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    code = run(argv)
    err = capsys.readouterr().err
    assert code == ExitCode.INVALID_INPUT
    assert one_error_line(err) == (
        "ndplan: error: standard output: cannot write to it (No space left on device)"
    )
    monkeypatch.undo()  # a writable stdout: the next command prints only its own output
    assert run(argv) == 0
    once = capsys.readouterr().out
    assert run(argv) == 0
    assert capsys.readouterr().out == once and once


# --------------------------------------------------------------- plugin faults found late


_LATE_FAULTS = {
    "replaces-a-typo": (
        "from ndplan.core.performance import NdplanCostModel\n"
        "@hookimpl\n"
        "def ndplan_register_cost_models(registry):\n"
        "    registry.add('ndplan-typo', NdplanCostModel, replace=True)\n",
        ["devices"],
        "cost model 'ndplan-typo' from '{m}' is registered with replace=True, but no other "
        "plugin registers 'ndplan-typo': fix the name to replace one (did you mean ndplan?), "
        "or drop replace=True to add it as a new one",
    ),
    "device-under-another-key": (
        "from ndplan.core.cluster import DeviceSpec\n"
        "@hookimpl\n"
        "def ndplan_register_devices(registry):\n"
        "    spec = DeviceSpec(id='x6000', memory_gib=80, peak_tflops={'bf16': 800},\n"
        "        hbm_bandwidth_gb_per_s=3000, scale_up={'bandwidth_gb_per_s': 450},\n"
        "        scale_out={'bandwidth_gb_per_s': 50}, host_link={'bandwidth_gb_per_s': 64})\n"
        "    registry.add('x6000-renamed', spec)\n",
        ["devices"],
        "device 'x6000-renamed' from '{m}' has id 'x6000', so it would be listed as 'x6000' "
        "but found only as 'x6000-renamed'; register it as its id: registry.add(spec.id, spec)",
    ),
    "factory-raising-lines": (
        "def factory(calibration):\n"
        "    raise RuntimeError('licence server unreachable\\n  host: lic.example\\n')\n"
        "@hookimpl\n"
        "def ndplan_register_cost_models(registry):\n"
        "    registry.add('ndplan', factory, replace=True)\n",
        ["estimate", "-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048"],
        "cost model 'ndplan' (from '{m}') could not be created: "
        "RuntimeError: licence server unreachable; host: lic.example",
    ),
}


@pytest.mark.parametrize("fault", sorted(_LATE_FAULTS))
def test_a_plugin_fault_is_one_line_naming_the_plugin_and_the_fix(
    fault: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body, argv, expected = _LATE_FAULTS[fault]
    module = f"late_fault_{fault.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text("from ndplan.plugins.hookspecs import hookimpl\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)

    code = run(["-p", module, *argv])

    err = capsys.readouterr().err
    err = "\n".join(ln for ln in err.splitlines() if not ln.startswith("assumed:"))
    assert code == ExitCode.PLUGIN_ERROR == 4
    assert one_error_line(err) == "ndplan: error: " + expected.format(m=module)


def test_an_unknown_disabled_plugin_is_one_warning_line_that_qq_drops(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "nosuch")

    assert run(["plugins", "--json"]) == ExitCode.OK
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "warning: NDPLAN_DISABLE_PLUGINS names 'nosuch', which is no loaded or installed "
        "plugin; plugins: ndplan.builtin"
    )

    assert run(["-qq", "plugins", "--json"]) == ExitCode.OK
    assert capsys.readouterr().err == ""
