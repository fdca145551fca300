"""``ndplan sweep`` (spec/interfaces.md): many searches in one command — models × device
types × device counts × batches × sequence lengths — one row per scenario with its best
plan or why it has none (a failed scenario is a row, not a crash), ``--json``/``--csv``."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pytest

from ndplan.cli.app import run
from ndplan.sweep import ROW_FIELDS

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"

SWEEP_YAML = """\
    # every combination of the top-level lists is one scenario, unless `scenarios` lists grids
    model: llama-3-8b
    device: [h100, a100-80gb]
    devices: [8, 16]
    gbs: 64
    seq_len: 2048
    space: {pp: 1, cp: 1}
    scenarios:
      - {}                                   # the top-level grid: 2 device types × 2 counts
      - {model: llama-3-70b, devices: 1}     # nothing fits on one device
      - {gbs: 100, device: h100}             # tp 1 pp 1 cp 1 below: dp = devices, 100 unreachable
"""


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_JOBS", "NDPLAN_DEBUG", "NDPLAN_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(SWEEP_YAML), encoding="utf-8")
    return path


def sweep_json(capsys, *args: str, code: int = 0) -> list[dict]:
    assert run(["sweep", *args, "--json"]) == code, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["scenarios"]


def test_flags_give_every_combination_in_order(capsys) -> None:
    rows = sweep_json(
        capsys,
        *["-m", "llama-3-8b", "-d", "h100", "-n", "8", "-n", "16", "--gbs", "64"],
        *["--gbs", "128", "-s", "2048", "-j", "1"],
    )
    assert [(r["devices"], r["gbs"]) for r in rows] == [(8, 64), (8, 128), (16, 64), (16, 128)]
    for r in rows:
        assert list(r) == list(ROW_FIELDS)
        assert r["status"] == "ok" and r["reason"] is None
        assert r["tp"] * r["pp"] * r["cp"] * r["dp"] == r["devices"]
        assert r["mbs"] * r["num_microbatches"] * r["dp"] == r["gbs"]
        assert r["step_s"] > 0 and 0 < r["mfu"] < 1 and 0 < r["peak_gib"] <= 80
        assert r["tokens_per_s_per_device"] > 0


def test_a_value_given_twice_is_one_scenario(capsys) -> None:
    rows = sweep_json(
        capsys,
        *["-m", "llama-3-8b", "-d", "h100", "-n", "8", "-n", "8", "--gbs", "64"],
        *["-s", "2048", "-j", "1"],
    )
    assert [(r["devices"], r["gbs"]) for r in rows] == [(8, 64)]


def test_comma_separated_values_are_the_same_as_repeated_flags(capsys) -> None:
    common = ["-d", "h100", "-s", "2048", "-j", "1"]
    repeated = sweep_json(
        capsys,
        "-m",
        "llama-3-8b",
        "-m",
        "qwen2.5-7b",
        "-n",
        "8",
        "-n",
        "16",
        "--gbs",
        "64",
        *common,
    )
    listed = sweep_json(capsys, "-m", "llama-3-8b,qwen2.5-7b", "-n", "8,16", "--gbs", "64", *common)
    assert listed == repeated and len(listed) == 4


def test_one_model_and_device_named_twice_is_one_scenario_and_said(capsys) -> None:
    """Aliases (h100 and h100-sxm, llama3-8b and llama-3-8b) name one problem: it is
    searched once, under the first names, and stderr says which were folded into it."""
    argv = ["sweep", "-m", "llama-3-8b", "-m", "llama3-8b", "-d", "h100", "-d", "h100-sxm"]
    argv += ["-n", "8", "--gbs", "64", "-s", "2048", "-j", "1", "--json"]
    assert run(argv) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["scenarios"]
    assert [(r["model"], r["device"]) for r in rows] == [("llama-3-8b", "h100-sxm")]
    folded = [line for line in captured.err.splitlines() if "searched once" in line]
    assert len(folded) == 3
    assert folded[0].startswith(
        "note: 'llama-3-8b on 8 × h100-sxm' repeats 'llama-3-8b on 8 × h100'"
    )


def test_failed_scenarios_are_rows_not_crashes(capsys, sweep_file: Path) -> None:
    space = sweep_file.parent / "space.yaml"
    space.write_text("tp: 1\npp: 1\ncp: 1\n", encoding="utf-8")
    rows = sweep_json(capsys, str(sweep_file), "-j", "1")
    assert [(r["model"], r["device"], r["devices"], r["gbs"]) for r in rows] == [
        ("llama-3-8b", "h100-sxm", 8, 64),
        ("llama-3-8b", "h100-sxm", 16, 64),
        ("llama-3-8b", "a100-80gb", 8, 64),
        ("llama-3-8b", "a100-80gb", 16, 64),
        ("llama-3-70b", "h100-sxm", 1, 64),
        ("llama-3-70b", "a100-80gb", 1, 64),
        ("llama-3-8b", "h100-sxm", 8, 100),
        ("llama-3-8b", "h100-sxm", 16, 100),
    ]
    statuses = [r["status"] for r in rows]
    assert statuses[:4] == ["ok"] * 4 and statuses[4:6] == ["infeasible"] * 2
    assert all(r["pp"] == 1 and r["cp"] == 1 for r in rows[:4])  # the file's space applies
    assert "no layout fits" in rows[4]["reason"] and rows[4]["tp"] is None
    # With --space fixing tp, pp and cp, dp is the device count, and 100 is unreachable.
    rows = sweep_json(capsys, str(sweep_file), "-j", "1", "--space", str(space))
    assert [r["status"] for r in rows[6:]] == ["invalid", "invalid"]
    assert "reachable batches near it" in rows[6]["reason"]


def test_table_and_csv(capsys, sweep_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "rows.csv"
    assert run(["sweep", str(sweep_file), "-j", "1", "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sweep: best plan per scenario" in printed
    assert "8 scenarios · 6 with a plan · 2 without" in printed
    assert "infeasible: no layout fits" in printed
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert list(rows[0]) == list(ROW_FIELDS) and len(rows) == 8
    assert rows[4]["status"] == "infeasible" and rows[4]["tp"] == ""
    assert [p.name for p in out.parent.iterdir()] == ["rows.csv"]  # no temporary left
    # Never overwritten without --force (checked before anything runs).
    assert run(["sweep", str(sweep_file), "-j", "1", "--csv", str(out)]) == 3
    assert "--force" in capsys.readouterr().err


def test_no_feasible_scenario_exits_1(capsys) -> None:
    rows = sweep_json(
        capsys, "-m", "llama-3-70b", "-d", "h100", "-n", "1", "--gbs", "8", "-s", "2048", code=1
    )
    assert [r["status"] for r in rows] == ["infeasible"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-m", "llama-9", "-d", "h100", "-n", "8", "--gbs", "8", "-s", "2048"], "llama-9"),
        (["-m", "llama-3-8b", "-d", "h100", "-n", "8"], "missing gbs, seq_len"),
        (["-m", "llama-3-8b", "-d", "h1OO", "-n", "8", "--gbs", "8", "-s", "2048"], "h1OO"),
        (
            ["-m", "llama-3-8b", "-d", "h100", "-n", "8,x", "--gbs", "8", "-s", "2048"],
            "-n/--devices 8,x: 'x' is not a whole number; give -n 8 -n 16 or -n 8,16",
        ),
        (
            ["-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "0", "-s", "2048"],
            "--gbs 0: 0 must be at least 1",
        ),
        (
            ["-m", "llama-3-8b,", "-d", "h100", "-n", "8", "--gbs", "8", "-s", "2048"],
            "-m/--model llama-3-8b,: an empty value; give e.g. llama-3-8b,llama-3-70b",
        ),
        (  # named as the flag typed, not as the field it fills
            ["-m", "llama-3-8b", "-d", "h100", "-n", "8,16777217", "--gbs", "8", "-s", "2048"],
            "-n/--devices 8,16777217: at most 16,777,216, got 16,777,217",
        ),
    ],
)
def test_bad_inputs_fail_the_sweep_with_one_line(capsys, args: list[str], needle: str) -> None:
    assert run(["sweep", *args, "-j", "1"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_unknown_key_in_the_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models: [llama-3-8b]\n", encoding="utf-8")
    assert run(["sweep", str(path)]) == 3
    assert "unknown key 'models'" in capsys.readouterr().err
    path.write_text("scenarios:\n  - {model: llama-3-8b, devise: h100}\n", encoding="utf-8")
    assert run(["sweep", str(path)]) == 3
    assert "scenarios[0]: unknown key 'devise'; did you mean device" in capsys.readouterr().err


def test_a_bad_value_in_the_file_names_the_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    grid = "model: llama-3-8b\ndevice: h100\ngbs: 64\nseq_len: 4096\n"
    path.write_text(grid + "devices: [8, x]\n", encoding="utf-8")
    assert run(["sweep", str(path)]) == 3
    err = capsys.readouterr().err
    assert f"{path}: devices: expected positive integers, got 'x'" in err
    path.write_text(grid + "scenarios:\n  - {devices: 0}\n", encoding="utf-8")
    assert run(["sweep", str(path)]) == 3
    err = capsys.readouterr().err
    assert f"{path}: scenarios[0]: devices: expected positive integers, got 0" in err


def test_a_plugin_error_aborts_the_sweep_naming_the_scenario(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    args = ["-p", "faulty_cost", "sweep", "-m", "llama-3-8b", "-d", "h100", "-n", "16"]
    assert run([*args, "--gbs", "256", "-s", "8192", "-j", "1"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "scenario llama-3-8b on 16 × h100-sxm · gbs 256 · seq 8192: candidate tp=2 " in err[0]
    assert "plugin 'faulty_cost' raised RuntimeError" in err[0]


@pytest.mark.slow
def test_pool_sweep_matches_serial(capsys, sweep_file: Path) -> None:
    serial = sweep_json(capsys, str(sweep_file), "-j", "1")
    pool = sweep_json(capsys, str(sweep_file), "-j", "2")
    assert pool == serial


def test_a_balanced_best_plan_states_its_layers_per_chunk(capsys, tmp_path: Path) -> None:
    """Llama 3 8B at pp 16: the best plan splits its layers unevenly; the row gives the
    counts as `estimate --layers-per-chunk` takes them, and the table marks the pp."""
    argv = ["-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "64", "-s", "8192"]
    space = tmp_path / "space.yaml"
    space.write_text("pp: 16\ntp: 1\nvpp: 1\nmbs: 1\n", encoding="utf-8")
    rows = sweep_json(capsys, *argv, "--space", str(space), "-j", "1")
    counts = [int(n) for n in rows[0]["layers_per_chunk"].split(",")]
    assert len(counts) == 16 and sum(counts) == 32 and counts[-1] < 2
    code = run(["sweep", *argv, "--space", str(space), "-j", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "16* " in out and "* decoder layers split unevenly" in out
    space.write_text("pp: 16\ntp: 1\nvpp: 1\nmbs: 1\nbalance_layers: false\n", encoding="utf-8")
    even = sweep_json(capsys, *argv, "--space", str(space), "-j", "1")
    assert even[0]["layers_per_chunk"] is None and even[0]["step_s"] > rows[0]["step_s"]


def test_a_dualpipev_best_plan_is_marked_in_the_table(capsys, tmp_path: Path) -> None:
    """The pp column marks DualPipeV with a v, as the search table does: pp 2 alone would
    read as a plain 1F1B pipeline."""
    argv = ["-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "64", "-s", "4096", "-j", "1"]
    space = tmp_path / "space.yaml"
    space.write_text("schedule: dualpipev\npp: 2\ntp: 1\n", encoding="utf-8")
    rows = sweep_json(capsys, *argv, "--space", str(space))
    assert rows[0]["schedule"] == "dualpipev" and rows[0]["pp"] == 2
    assert run(["sweep", *argv, "--space", str(space)]) == 0
    out = capsys.readouterr().out
    assert "│ 2v │" in out and "1 scenario · 1 with a plan" in out
    assert run(["search", *argv, "--space", str(space), "-t", "1"]) == 0
    assert "│ 2v" in capsys.readouterr().out


def test_job_settings_apply_to_every_scenario_as_in_search(capsys, tmp_path: Path) -> None:
    """The sweep file's `job:` mapping (or --job FILE) is what `ndplan search --job` takes:
    DeepEP dispatch makes EP across the two nodes the best plan, as search finds it."""
    grid = ["-m", "qwen3-30b-a3b", "-d", "h100", "-n", "16", "--gbs", "256", "-s", "4096"]
    path = tmp_path / "sweep.yaml"
    path.write_text("precision: fp8\njob: {moe_dispatcher: deepep}\n", encoding="utf-8")
    (deepep,) = sweep_json(capsys, str(path), *grid, "-j", "1")
    (alltoall,) = sweep_json(capsys, *grid, "--precision", "fp8", "-j", "1")
    assert run(["search", *grid, "--precision", "fp8", "--moe-dispatcher", "deepep", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["plans"][0]
    assert deepep["step_s"] == best["time"]["step_s"]
    assert (deepep["ep"], best["layout"]["ep"]) == (16, 16)
    assert deepep["step_s"] < alltoall["step_s"]
    job = tmp_path / "job.yaml"
    job.write_text("moe_dispatcher: deepep\n", encoding="utf-8")
    (from_flag,) = sweep_json(capsys, *grid, "--precision", "fp8", "--job", str(job), "-j", "1")
    assert from_flag == deepep


def test_a_bad_job_setting_names_where_it_came_from(capsys, tmp_path: Path) -> None:
    grid = ["-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "64", "-s", "2048"]
    path = tmp_path / "sweep.yaml"
    path.write_text("job: {moe_dispatch: deepep}\n", encoding="utf-8")
    assert run(["sweep", str(path), *grid, "-j", "1"]) == 3
    assert "job: unknown key 'moe_dispatch'; did you mean moe_dispatcher?" in (
        capsys.readouterr().err
    )
    path.write_text("job: {optimizer: lion}\n", encoding="utf-8")
    assert run(["sweep", str(path), *grid, "-j", "1"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ndplan: error: {path}: job: optimizer:")


def test_a_sweep_reports_what_it_assumed_as_search_does(capsys, tmp_path: Path) -> None:
    """Each row says what its search assumed, and one ``assumed:`` line under the table
    gives them all once (with what reading a model assumed), as ``search`` prints it; a
    stated field is not among them."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "hidden_size": 1024,
                "num_hidden_layers": 4,
                "num_attention_heads": 16,
                "intermediate_size": 4096,
                "vocab_size": 32000,
            }
        ),
        encoding="utf-8",
    )
    problem = ["-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048", "--precision", "bf16"]
    problem += ["-j", "1"]
    assert run(["sweep", "-m", str(config), "-m", "llama-3-8b", *problem]) == 0
    captured = capsys.readouterr()
    (line,) = [x for x in captured.err.splitlines() if x.startswith("assumed: ")]
    assumed = line.removeprefix("assumed: ").split("; ")
    assert assumed == sorted(assumed) and len(set(assumed)) == len(assumed)
    assert "job.framework=megatron (pricing)" in assumed
    assert any(a.startswith("model.") and a.endswith("(hf reader)") for a in assumed)
    assert not any(a.startswith("job.precision=") for a in assumed)  # stated
    assert run(["search", "-m", "llama-3-8b", *problem]) == 0
    searched = next(
        x for x in capsys.readouterr().err.splitlines() if x.startswith("assumed: ")
    ).removeprefix("assumed: ")
    rows = sweep_json(capsys, "-m", str(config), "-m", "llama-3-8b", *problem)
    assert rows[1]["assumed"] == searched  # the same search, the same defaults
    assert set(rows[0]["assumed"].split("; ")) <= set(assumed)
