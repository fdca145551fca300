"""Mistakes a user makes, each answered with one line and exit 3 (or a warning where the
input is valid but does nothing), never an internal error, a hang or a silent guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from ndplan.cli.app import run

REPO = Path(__file__).resolve().parents[2]
PROBLEM = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048")
SEARCH = ("search", *PROBLEM, "-j", "1")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        monkeypatch.delenv(var, raising=False)


def error_line(capsys, *argv: str) -> str:
    code = run(list(argv))
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if not line.startswith("assumed:")]
    assert code == 3, captured.err
    assert captured.out == "" and len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith("ndplan: error: ")
    return lines[0]


def test_a_utf16_space_file_is_named_not_an_internal_error(capsys, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("tp: [2, 4]\n", encoding="utf-16")  # as Windows Notepad saves it
    line = error_line(capsys, *SEARCH, "--space", str(space))
    assert f"{space}: the search-space file is not UTF-8 text; save it as UTF-8" in line


def test_a_key_stated_twice_in_a_yaml_file_is_refused(capsys, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("tp: 2\npp: 1\ntp: 4\n")
    line = error_line(capsys, *SEARCH, "--space", str(space))
    assert "not valid YAML: 'tp' is stated twice (line 3)" in line


def test_a_home_of_no_user_is_no_such_file(capsys) -> None:
    line = error_line(capsys, "search", "-m", "~no-such-user-here/config.json", *PROBLEM[2:])
    assert "~no-such-user-here/config.json: no such file or directory" in line


@pytest.mark.parametrize(
    ("flag", "named"),
    [("-n", "'--devices' / '-n'"), ("--gbs", "'--gbs'"), ("-s", "'--seq-len' / '-s'")],
)
@pytest.mark.parametrize("command", ["search", "estimate"])
def test_a_mistyped_huge_count_is_refused_at_once(capsys, command, flag: str, named: str) -> None:
    # The search enumerates divisors of these: 10^15 would run for hours, not fail. The
    # flag is out of its range as a count of 0 is: a malformed flag (exit 2), named as
    # the user typed it rather than by the field it fills.
    argv = [command, *PROBLEM]
    argv[argv.index(flag) + 1] = "1000000000000000"
    code = run(argv)
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "Traceback" not in captured.err
    assert f"Invalid value for {named}: " in captured.err and "16777216" in captured.err


def test_a_baseline_degree_given_twice_is_refused(capsys) -> None:
    line = error_line(capsys, *SEARCH, "--baseline", "tp=4,tp=2")
    assert line == "ndplan: error: --baseline: tp is given twice; give it once"


def test_an_empty_baseline_is_refused(capsys) -> None:
    assert "--baseline: empty" in error_line(capsys, *SEARCH, "--baseline", " ")


def test_a_failed_search_leaves_no_empty_debug_folder(capsys, tmp_path: Path) -> None:
    folder = tmp_path / "debug"
    error_line(capsys, *SEARCH, "--tp", "3", "--debug-dir", str(folder))
    assert not folder.exists()


@pytest.mark.parametrize(
    ("model", "extra", "why"),
    [
        ("qwen3-30b-a3b", (), "there is no expert parallelism (ep 1)"),
        ("qwen3-30b-a3b", ("--ep", "8", "--recompute", "full"), "every layer is recomputed"),
    ],
)
def test_an_a2a_overlap_that_cannot_apply_says_so(capsys, model, extra, why) -> None:
    problem = ("-m", model, "-d", "h100", "-n", "16", "--gbs", "64", "-s", "4096")
    code = run(["estimate", *problem, "--moe-a2a-overlap", *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"warning: --moe-a2a-overlap has no effect: {why}" in err


def test_a_device_file_replacing_a_builtin_part_says_so(capsys, tmp_path: Path) -> None:
    device = tmp_path / "lab.yaml"
    builtin = REPO / "src" / "adapters" / "devices" / "data"
    source = next(p for p in sorted(builtin.glob("*.yaml")) if "id: h100-sxm" in p.read_text())
    device.write_text(source.read_text())
    code = run(["devices", "--device-file", str(device)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"{device}: device 'h100-sxm' replaces the one from 'ndplan.builtin'" in err


def test_an_attached_home_path_means_what_the_shell_would_make_of_it(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--ranking-csv ~/r.csv` reaches ndplan expanded; `--ranking-csv=~/r.csv` does not.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    code = run(["-q", *SEARCH, "--ranking-csv=~/r.csv"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "home" / "r.csv").is_file() and not (tmp_path / "~").exists()


def test_estimate_says_when_tp_spans_beyond_the_scale_up_domain(capsys) -> None:
    problem = ("-m", "llama-3-70b", "-d", "h100", "-n", "64", "--gbs", "512", "-s", "8192")
    code = run(["estimate", *problem, "--tp", "16", "--pp", "4"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "warning: tp 16 spans more than the h100-sxm's scale-up domain (8 devices)" in err
    assert "unless given --max-tp 16" in err
    code = run(["estimate", *problem, "--tp", "8", "--pp", "4"])
    assert code == 0 and "scale-up domain" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "flag", "choices"),
    [
        ("estimate", "--recompute", "none, selective, full, auto or stated"),
        ("estimate", "--schedule", "1f1b, interleaved, gpipe or dualpipev"),
        ("estimate", "--memory-mode", "ndplan or megatron"),
        ("balance", "--recompute", "none, selective, full, auto or stated"),
        ("search", "--recompute", "none, selective, full, auto or stated"),
    ],
)
def test_a_named_choice_given_wrong_names_every_choice(capsys, command, flag, choices) -> None:
    line = error_line(capsys, command, *PROBLEM, flag, "bogus")
    assert line == f"ndplan: error: {flag}: 'bogus' unknown; use {choices}"
