"""``ndplan compare`` (issue 5): predicted against measured step time, and calibration fits.

- on the published runs, every row that states enough is priced and the skips are
  reported by reason (human and ``--json``); ``--rows even|odd`` is the fixed split;
- ``--fit OUT.json`` fits on the given rows and writes a calibration file that
  ``--calibration FILE`` loads in ``estimate`` and ``search`` (on a ~17-row CSV cut from
  the real one, one sweep, so it runs in seconds); the file validates as a Calibration,
  prices differently from the shipped one, and is not overwritten without ``--force``
  (exit 3, file untouched);
- bad input is exit 3 with one line: a CSV without the required columns, a file that
  does not exist, an invalid, binary or absent calibration file (naming the field), one
  keyed by a device, family or framework nothing would read (a device file's id is read),
  a non-UTF-8 CSV, an unknown ``--rows``; a truncated row is skipped with a reason.
"""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import pytest

from ndplan.adapters.devices.calibration import load_calibration, shipped_calibration
from ndplan.cli import output
from ndplan.cli.app import run
from ndplan.cli.compare import EP_SHARE_BUCKETS
from ndplan.core.calibration import Calibration
from ndplan.core.errors import ExitCode
from ndplan.validation import fit_calibration

# = tests/conftest.py::SHARED_DATA
SHARED_DATA = Path(__file__).resolve().parents[1] / "data" / "shared"
RUNS = SHARED_DATA / "measured_runs.csv"
TOTAL_ROWS = 607

# A cut of the real data: dense and MoE, five device types, six sources, both parities,
# plus a hybrid Mamba row (skipped) and a CHECK row (priced, kept out of the fit).
SMALL_IDS = (11, 21, 22, 23, 24, 200, 201, 202, 203, 316, 340, 341, 344, 345, 372, 405, 406)
MAMBA_ROW, CHECK_ROW = 11, 316
ESTIMATE = ("-m", "llama-3.1-8b", "-d", "h100-sxm", "-n", "8", "--gbs", "64", "-s", "4096")

compare_module = importlib.import_module("ndplan.cli.compare")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(output.stdout, "_width", 200)  # tables at 200 columns


def invoke(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run([*argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("ndplan: error: ")
    assert "Traceback" not in err
    return lines[0]


_ALL: dict[str, dict] = {}


@pytest.fixture
def compare_all(capsys: pytest.CaptureFixture[str]) -> dict:
    """`ndplan compare measured_runs.csv --json`, run once per session."""
    if "doc" not in _ALL:
        code, out, err = invoke(capsys, "compare", str(RUNS), "--json")
        assert code == 0, err
        _ALL["doc"] = json.loads(out)
    return _ALL["doc"]


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    return runs_csv(tmp_path / "small.csv", SMALL_IDS)


def runs_csv(path: Path, row_ids: tuple[int, ...], **changes: str) -> Path:
    """A CSV of the real rows ``row_ids`` (all of them must exist), ``changes`` applied."""
    with RUNS.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames
        rows = [{**r, **changes} for r in reader if int(r["row_id"]) in row_ids]
    assert len(rows) == len(row_ids)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture
def one_sweep(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The CLI's fit with one coordinate sweep (seconds, not minutes); records its rows."""
    calls: list[list[int]] = []

    def fit(planner, cases, base=None, **kwargs):
        calls.append([c.row_id for c in cases if not c.check])
        return fit_calibration(planner, cases, base, **{**kwargs, "sweeps": 1})

    monkeypatch.setattr(compare_module, "fit_calibration", fit)
    return calls


# --------------------------------------------------------------------------- the published runs


def test_compare_prices_every_row_that_states_enough(compare_all: dict) -> None:
    rows, skipped = compare_all["rows"], compare_all["skipped"]
    assert len(rows) + len(skipped) == TOTAL_ROWS
    assert sum(s["reason"].startswith("hybrid Mamba") for s in skipped) == 53
    assert len({r["row_id"] for r in rows} | {s["row_id"] for s in skipped}) == TOTAL_ROWS
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted_step_s"] / r["measured_step_s"] - 1)
        assert r["split"] == ("fit" if r["row_id"] % 2 == 0 else "test")
        assert r["step_from"] in (
            "step_time",
            "tokens/s",
            "tflops (full attention)",
            "tflops (causal attention)",
        )
    for s in skipped:
        assert s["reason"] and s["model"] and s["source"]
    assert compare_all["calibration"] == shipped_calibration().source
    overall = {g["group"] for g in compare_all["summary"]["overall"]}
    assert {
        "fit rows (even row_id) · dense",
        "fit rows (even row_id) · MoE",
        "test rows (odd row_id) · dense",
        "test rows (odd row_id) · MoE",
        "CHECK rows (source contradicts itself)",
    } == overall
    assert set(compare_all["summary"]) == {
        "overall",
        "source",
        "hardware",
        "family",
        "family and precision",
        "tensor-parallel degree",
        "pipeline schedule",
        "predicted EP share of the step (MoE)",
    }
    # Each clean row falls in one family-and-precision group, named by what it ran.
    by_precision = compare_all["summary"]["family and precision"]
    clean = [r for r in rows if not r["check"]]
    assert sum(g["rows"] for g in by_precision) == len(clean)
    for r in clean:
        label = f"{r['family']} · {r['precision']} ({'MoE' if r['moe'] else 'dense'})"
        assert label in {g["group"] for g in by_precision}, label
    # ... and in one group of each layout-shape section: its TP degree, its pipeline
    # schedule and, for MoE rows, its band of predicted EP share.
    summary = compare_all["summary"]
    for section, rows_in in (
        ("tensor-parallel degree", clean),
        ("pipeline schedule", clean),
        ("predicted EP share of the step (MoE)", [r for r in clean if r["moe"]]),
    ):
        assert sum(g["rows"] for g in summary[section]) == len(rows_in), section
    tp_groups = {g["group"] for g in summary["tensor-parallel degree"]}
    for r in clean:
        assert f"tp {r['tp']} ({'MoE' if r['moe'] else 'dense'})" in tp_groups
        assert r["layout"].startswith(f"tp{r['tp']} ")
        assert (r["pipeline"] == "none") == (" pp1 " in r["layout"])
    assert [g["group"] for g in summary["tensor-parallel degree"]][:2] == [
        "tp 1 (dense)",
        "tp 2 (dense)",
    ]
    ep_bands = [g["group"] for g in summary["predicted EP share of the step (MoE)"]]
    assert ep_bands == sorted(ep_bands, key=EP_SHARE_BUCKETS.index)
    assert compare_all["memory"] and compare_all["ranking"]


def test_compare_human_output_reports_skips_by_reason(
    capsys: pytest.CaptureFixture[str], compare_all: dict
) -> None:
    code, out, err = invoke(capsys, "compare", str(RUNS), "--summary-only")
    assert code == 0, err
    assert "predicted vs measured step time" not in out  # --summary-only
    for title in ("|error| by overall", "|error| by source", "|error| by hardware"):
        assert title in out
    assert f"skipped rows ({len(compare_all['skipped'])})" in out
    for reason in {s["reason"] for s in compare_all["skipped"]}:
        assert reason in out, reason
    assert "ranking within groups" in out and "peak memory" in out


@pytest.mark.parametrize(("rows", "parity"), [("even", 0), ("odd", 1)])
def test_rows_selects_the_fixed_split(
    capsys: pytest.CaptureFixture[str], compare_all: dict, rows: str, parity: int
) -> None:
    code, out, err = invoke(capsys, "compare", str(RUNS), "--rows", rows, "--json")
    assert code == 0, err
    doc = json.loads(out)
    ids = [r["row_id"] for r in doc["rows"]] + [s["row_id"] for s in doc["skipped"]]
    assert ids and all(i % 2 == parity for i in ids)
    expected = {r["row_id"] for r in compare_all["rows"] if r["row_id"] % 2 == parity}
    assert {r["row_id"] for r in doc["rows"]} == expected


def test_small_csv_per_row_output(capsys: pytest.CaptureFixture[str], small_csv: Path) -> None:
    code, out, err = invoke(capsys, "compare", str(small_csv))
    assert code == 0, err
    assert "predicted vs measured step time" in out
    assert "skipped rows (1)" in out and "Mamba" in out
    for row_id in SMALL_IDS:
        if row_id != MAMBA_ROW:
            assert f"│{row_id} " in out or f"│ {row_id} " in out, row_id


# --------------------------------------------------------------------------- --fit


def test_fit_writes_a_calibration_that_estimate_and_search_load(
    capsys: pytest.CaptureFixture[str],
    small_csv: Path,
    tmp_path: Path,
    one_sweep: list[list[int]],
) -> None:
    fit = tmp_path / "fit.json"
    code, out, err = invoke(
        capsys, "compare", str(small_csv), "--rows", "even", "--fit", str(fit), "--json"
    )
    assert code == 0, err
    # fitted on the even rows of the file, CHECK row excluded
    even_clean = sorted(i for i in SMALL_IDS if i % 2 == 0 and i != CHECK_ROW)
    assert one_sweep == [even_clean]
    assert "fitting on 8 rows" in err and f"wrote {fit}" in err
    assert "sweep 1: objective " in err  # a long fit shows it is moving

    cal = Calibration.model_validate_json(fit.read_text(encoding="utf-8"))
    assert load_calibration(fit) == cal
    assert cal.fit["rows"] == len(even_clean) == 8
    assert cal.source == "ndplan compare --fit on small.csv (even rows)"
    assert cal != shipped_calibration()
    # the comparison that follows the fit is priced with the new file
    doc = json.loads(out)
    assert doc["calibration"] == cal.source

    # estimate: same layout, other calibration → another step time
    code, out, err = invoke(capsys, "estimate", *ESTIMATE, "--json")
    assert code == 0, err
    shipped_step = json.loads(out)["time"]["step_s"]
    code, out, err = invoke(capsys, "estimate", *ESTIMATE, "--json", "--calibration", str(fit))
    assert code == 0, err
    fitted_step = json.loads(out)["time"]["step_s"]
    assert fitted_step != pytest.approx(shipped_step, rel=1e-6)

    # search: loads it too, and prices its plans with it
    search = ("search", *ESTIMATE, "--tp", "1", "--pp", "1", "-t", "3", "--json")
    code, out, err = invoke(capsys, *search)
    assert code == 0, err
    shipped_plans = json.loads(out)["plans"]
    code, out, err = invoke(capsys, *search, "--calibration", str(fit))
    assert code == 0, err
    fitted_plans = json.loads(out)["plans"]
    assert fitted_plans
    assert [p["time"]["step_s"] for p in fitted_plans] != pytest.approx(
        [p["time"]["step_s"] for p in shipped_plans], rel=1e-6
    )


def test_fit_refuses_to_overwrite_without_force(
    capsys: pytest.CaptureFixture[str],
    small_csv: Path,
    tmp_path: Path,
    one_sweep: list[list[int]],
) -> None:
    fit = tmp_path / "fit.json"
    fit.write_text("precious\n", encoding="utf-8")
    code, out, err = invoke(capsys, "compare", str(small_csv), "--fit", str(fit))
    assert code == ExitCode.INVALID_INPUT
    line = one_error_line(err)
    assert str(fit) in line and "--force" in line
    assert out == ""
    assert fit.read_text(encoding="utf-8") == "precious\n"
    assert one_sweep == []  # refused before fitting

    code, _, err = invoke(
        capsys, "compare", str(small_csv), "--rows", "odd", "--fit", str(fit), "--force"
    )
    assert code == 0, err
    cal = load_calibration(fit)
    odd_priced = [i for i in SMALL_IDS if i % 2 == 1 and i != MAMBA_ROW]
    assert one_sweep == [odd_priced]
    assert cal.fit["rows"] == len(odd_priced)


# --------------------------------------------------------------------------- bad input


def test_csv_missing_required_columns(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "runs.csv"
    bad.write_text("row_id,model,hardware\n1,Llama 3 70B,H100\n", encoding="utf-8")
    code, out, err = invoke(capsys, "compare", str(bad))
    assert code == ExitCode.INVALID_INPUT
    line = one_error_line(err)
    assert "missing column" in line and "source" in line and "num_gpus" in line
    assert out == ""


def test_csv_that_is_not_utf8_or_has_short_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    header = "row_id,source,model,hardware,num_gpus,tp\n"
    binary = tmp_path / "binary.csv"
    binary.write_bytes(header.encode() + b"\xff\xfe1,x,y,z,8,1\n")
    code, _, err = invoke(capsys, "compare", str(binary))
    assert code == ExitCode.INVALID_INPUT
    assert "binary.csv" in one_error_line(err)
    # a truncated row reads as unstated cells: skipped with a reason, not a crash (and
    # as the file's only row, the one line saying why nothing could be compared)
    short = tmp_path / "short.csv"
    short.write_text(header + "1,x\n", encoding="utf-8")
    code, out, err = invoke(capsys, "compare", str(short), "--json")
    assert code == ExitCode.INVALID_INPUT and out == ""
    assert "its one row cannot be priced (architecture of '' unknown" in one_error_line(err)


def test_nonexistent_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = invoke(capsys, "compare", str(tmp_path / "absent.csv"))
    assert code == ExitCode.INVALID_INPUT
    assert "absent.csv" in one_error_line(err)


@pytest.mark.parametrize(
    "argv",
    [
        ("compare", str(RUNS), "--summary-only"),
        ("estimate", *ESTIMATE),
        ("search", *ESTIMATE, "--tp", "1", "--pp", "1"),
    ],
    ids=["compare", "estimate", "search"],
)
def test_invalid_calibration_file_names_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: tuple[str, ...]
) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"default": {"gemm": 1.5}}), encoding="utf-8")
    code, _, err = invoke(capsys, *argv, "--calibration", str(bad))
    assert code == ExitCode.INVALID_INPUT
    line = one_error_line(err)
    assert "default.gemm" in line and "cal.json" in line


def _shipped_with(change) -> dict:
    data = json.loads(shipped_calibration().model_dump_json())
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "where", "hint"),
    [
        (lambda d: d["devices"].update(hoper=d["devices"]["hopper"]), "devices.hoper", "'hopper'"),
        (lambda d: d["families"].update({"h100": "hopper"}), "families.h100", "'h100-sxm'"),
        (lambda d: d["overlap"].update(megatorn={}), "overlap.megatorn", "'megatron'"),
        (lambda d: d["attention_scale"].update(titan=1.0), "attention_scale.titan", "torchtitan"),
        # Family keys without the map that names them: no device would ever read them.
        (lambda d: d.pop("families"), "devices.ampere", "families"),
    ],
    ids=["device-typo", "device-alias", "framework-typo", "scale-typo", "no-families"],
)
def test_calibration_keys_nothing_would_read_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, change, where: str, hint: str
) -> None:
    """A misspelt device, family or framework key would leave its fit unused and price
    with the defaults: refused, naming the key and the fix."""
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps(_shipped_with(change)), encoding="utf-8")
    code, _, err = invoke(capsys, "estimate", *ESTIMATE, "--calibration", str(bad))
    assert code == ExitCode.INVALID_INPUT
    line = one_error_line(err)
    assert f"{where}:" in line and hint in line and "cal.json" in line


def test_calibration_keys_by_a_device_files_id_are_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A device added by --device-file is a known id, and its fit is what prices it;
    without one, the default fit prices it and the assumptions line says so (--strict
    refuses, naming the fix)."""
    device = tmp_path / "lab.yaml"
    source = Path(importlib.import_module("ndplan.adapters.devices.data").__file__).parent
    lines = (source / "h100-sxm.yaml").read_text(encoding="utf-8").splitlines()
    lab = [
        "id: lab-h100" if ln.startswith("id:") else ln
        for ln in lines
        if not ln.startswith("aliases:")
    ]
    device.write_text("\n".join(lab) + "\n", encoding="utf-8")
    slow = _shipped_with(
        lambda d: d["devices"].update({"lab-h100": {**d["devices"]["hopper"], "gemm": 0.2}})
    )
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(slow), encoding="utf-8")
    argv = (
        "estimate",
        "-m",
        "llama-3.1-8b",
        "-d",
        "lab-h100",
        "-n",
        "8",
        "--gbs",
        "64",
        "-s",
        "4096",
    )
    argv += ("--device-file", str(device), "--json")
    code, default_out, err = invoke(capsys, *argv)
    assert code == 0, err
    # Priced with the cross-device fit until a file fits it, and the assumptions say so.
    assert "calibration.devices.lab-h100=default (pricing: no fit for it or its family)" in err
    code, fitted_out, err = invoke(capsys, *argv, "--calibration", str(cal))
    assert code == 0, err
    assert "calibration.devices" not in err
    job = tmp_path / "job.yaml"  # every job field stated: the device's fit is what is left
    job.write_text(
        "framework: megatron\nprecision: bf16\noptimizer: adam\nattention_kernel: flash\n"
        "dropout: 0.0\nfinetune: full\nactivation_offload: false\nfused_loss: true\n"
        "grad_reduce_dtype: fp32\n",
        encoding="utf-8",
    )
    code, _, err = invoke(capsys, *argv, "--strict", "--zero", "1", "--job", str(job))
    assert code == ExitCode.INVALID_INPUT
    assert "give --calibration a file with a fit for it" in one_error_line(err)
    assert json.loads(fitted_out)["time"]["step_s"] > json.loads(default_out)["time"]["step_s"]


def test_a_framework_no_fit_names_prices_with_default_overlap_and_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """DeepSpeed has no measured runs: its hidden communication shares are the engineering
    defaults, stated on the assumptions line with their values; --strict refuses, naming
    the fix; a calibration with a DeepSpeed overlap fit prices it and is silent."""
    argv = ("estimate", "-m", "llama-3.1-8b", "-d", "h100", "-n", "16", "--gbs", "64")
    argv += ("-s", "4096", "--tp", "2", "--zero", "1", "--json")
    code, default_out, err = invoke(capsys, *argv, "--framework", "deepspeed")
    assert code == 0, err
    assert "calibration.overlap.deepspeed=default (pricing: no fit for this framework;" in err
    assert "hidden shares tp 0, cp 1, ep 0, pp 0.8, dp 0.9, fsdp 0.8)" in err
    code, _, err = invoke(capsys, *argv, "--framework", "megatron")
    assert code == 0 and "calibration.overlap" not in err  # fitted on its measured runs
    hidden = _shipped_with(lambda d: d["overlap"].update({"deepspeed": {"dp": 0.0}}))
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(hidden), encoding="utf-8")
    code, fitted_out, err = invoke(
        capsys, *argv, "--framework", "deepspeed", "--calibration", str(cal)
    )
    assert code == 0, err
    assert "calibration.overlap" not in err
    # No gradient reduction hidden: the step is longer by exactly what was hidden before.
    fitted, default = json.loads(fitted_out)["time"], json.loads(default_out)["time"]
    assert fitted["parts"]["dp_comm"] > default["parts"]["dp_comm"]
    assert fitted["step_s"] > default["step_s"]
    job = tmp_path / "job.yaml"
    job.write_text(
        "framework: deepspeed\nprecision: bf16\noptimizer: adam\nattention_kernel: flash\n"
        "dropout: 0.0\nfinetune: full\nactivation_offload: false\nfused_loss: false\n"
        "grad_reduce_dtype: fp32\ntp_comm_overlap: false\n",
        encoding="utf-8",
    )
    code, _, err = invoke(capsys, *argv, "--strict", "--job", str(job))
    assert code == ExitCode.INVALID_INPUT
    line = one_error_line(err)
    assert "calibration.overlap.deepspeed" in line and "overlap fit for it" in line


def test_calibration_file_that_is_not_json_or_absent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text("{not json", encoding="utf-8")
    code, _, err = invoke(capsys, "estimate", *ESTIMATE, "--calibration", str(bad))
    assert code == ExitCode.INVALID_INPUT
    assert "not valid JSON" in one_error_line(err)
    code, _, err = invoke(capsys, "estimate", *ESTIMATE, "--calibration", str(tmp_path / "no.json"))
    assert code == ExitCode.INVALID_INPUT
    assert "no.json" in one_error_line(err)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    code, _, err = invoke(capsys, "estimate", *ESTIMATE, "--calibration", str(binary))
    assert code == ExitCode.INVALID_INPUT
    assert "binary.json" in one_error_line(err)


def test_unknown_rows_selector(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = invoke(capsys, "compare", str(RUNS), "--rows", "third")
    assert code == ExitCode.INVALID_INPUT
    assert "--rows" in one_error_line(err)


def _one_row_csv(tmp_path: Path, **changes: str) -> Path:
    """A CSV of one real row (a dense H100 one that prices) with ``changes`` applied."""
    return runs_csv(tmp_path / "one.csv", (345,), **changes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"tp": "four"}, "tp 'four' is not a positive number"),
        ({"tp": "0"}, "tp '0' is not a positive number"),
        ({"num_gpus": "0"}, "num_gpus '0' is not a positive number"),
        ({"step_time_s": "-5"}, "step_time_s '-5' is not a positive number"),
        ({"tokens_per_sec_per_gpu": "nan"}, "tokens_per_sec_per_gpu 'nan' is not a positive"),
        ({"precision": "int4"}, "precision 'int4' unknown"),
        ({"row_id": "abc"}, "row_id 'abc' is not a whole number"),
    ],
)
def test_a_row_with_an_unusable_value_is_skipped_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, changes: dict, reason: str
) -> None:
    """Not read as a default (tp 1, bf16, row 0) and priced as if the source said so: the
    row is skipped by name, and a file of nothing else is one line saying why (exit 3)."""
    runs = _one_row_csv(tmp_path, **changes)
    code, out, err = invoke(capsys, "compare", str(runs), "--json")
    assert code == 3 and out == ""
    assert f"{runs}: its one row cannot be priced ({reason}" in one_error_line(err)
    beside = runs_csv(tmp_path / "two.csv", (345,))  # beside a row that prices, listed
    beside.write_text(beside.read_text() + runs.read_text().split("\n", 1)[1], encoding="utf-8")
    code, out, err = invoke(capsys, "compare", str(beside), "--json")
    assert code == 0, err
    doc = json.loads(out)  # valid JSON: no NaN from a NaN throughput
    assert [r["row_id"] for r in doc["rows"]] == [345]
    assert next(s["reason"] for s in doc["skipped"]).startswith(reason)


def test_the_unchanged_row_prices(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = invoke(capsys, "compare", str(_one_row_csv(tmp_path)), "--json")
    assert code == 0, err
    assert [r["row_id"] for r in json.loads(out)["rows"]] == [345]


def test_fit_with_no_row_to_fit_is_invalid_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = _one_row_csv(tmp_path, step_time_s="-5")
    out_file = tmp_path / "cal.json"
    code, _out, err = invoke(capsys, "compare", str(runs), "--fit", str(out_file))
    assert code == 3 and not out_file.exists()
    assert f"{runs}: its one row cannot be priced (step_time_s '-5'" in one_error_line(err)
