"""``ndplan search`` and ``ndplan demo`` (issue 7, spec/search.md § Outputs,
spec/interfaces.md): what varies (-l/--vary, fixed flags, --space YAML), the ranking
table and summary line, ``--json`` (the shape of ``estimate --json`` plus a rank),
``--ranking-csv`` (never clobbered without --force), the debug sinks (built in and a
plugin's, fed the same records), a plugin's refusal rule, and the exit codes of a
problem with no plan (1) or an unreachable batch (3)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ndplan.cli import output
from ndplan.cli.app import run
from ndplan.cli.render import near_tie_note, unfilled_pipeline_warning
from ndplan.core.calibration import median_error_key
from ndplan.core.errors import BaselineError
from ndplan.core.job import Job
from ndplan.core.layout import Layout, SearchSpace, layout_label
from ndplan.core.search import FIELDS, SearchPricing
from ndplan.planner import Planner

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
SMALL = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048", "-j", "1")
# Memory is tight: per-layer recompute mixes show up in the top plans.
TIGHT = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "32", "-s", "4096")
TIGHT += ("--max-mem", "24", "-j", "1")
LAYOUT_KEYS = {
    "dp",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "mbs",
    "num_microbatches",
    "zero",
    "sp",
    "schedule",
    "recompute",
    "offload_optimizer",
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(output.stdout, "_width", 400)  # the summary line on one line
    monkeypatch.syspath_prepend(str(PLUGINS))


def invoke(capsys, *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def search_json(capsys, *argv: str) -> dict:
    code, out, err = invoke(capsys, "search", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("assumed:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("ndplan: error: ") and "Traceback" not in err
    return lines[0]


def without_seconds(data: dict) -> dict:
    return {**data, "summary": {k: v for k, v in data["summary"].items() if k != "seconds"}}


def layout_flags(layout: dict) -> list[str]:
    """``ndplan estimate`` flags for a layout from ``--json``."""
    flags = []
    for key in ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "mbs", "zero"):
        flags += [f"--{key}", str(layout[key])]
    flags += ["--sp" if layout["sp"] else "--no-sp", "--schedule", layout["schedule"]]
    flags += ["--recompute", layout["recompute"]]
    if layout["offload_optimizer"]:
        flags.append("--offload-optimizer")
    return flags


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# ----------------------------------------------------------------------------- --json


@pytest.mark.parametrize(
    ("argv", "uneven"),
    [
        (TIGHT, False),
        # MoE, with EP, and the default split uneven (27 layers over 16 chunks)
        (
            (
                "-m",
                "deepseek-v2-lite",
                "-d",
                "h100",
                "-n",
                "16",
                "--gbs",
                "64",
                "-s",
                "4096",
                "--pp",
                "4",
            ),
            True,
        ),
    ],
)
def test_the_best_plans_estimate_flags_price_it_again(capsys, argv: tuple, uneven: bool) -> None:
    """The report's 'estimate flags:' line, after the search's own flags, gives estimate
    the very plan the search ranked first: the same step time and peak, to the bit."""
    code, out, err = invoke(capsys, "search", *argv, "-t", "1")
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("estimate flags: ")]
    flags = line.removeprefix("estimate flags: ").split()
    assert ("--layers-per-chunk" in flags) == uneven
    best = search_json(capsys, *argv, "-t", "1")["plans"][0]
    problem = argv[:-2] if argv[-2] == "-j" else argv  # estimate runs no workers
    code, out, err = invoke(capsys, "estimate", *problem, *flags, "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["time"]["step_s"] == best["time"]["step_s"]
    assert again["memory"]["peak_bytes"] == best["memory"]["peak_bytes"]
    # A layout that leaves expert TP unstated runs it at TP's own degree.
    stated = again["layout"]
    assert {**stated, "etp": stated["etp"] or stated["tp"]} == best["layout"]


def test_json_is_a_summary_and_plans_shaped_like_estimate_plus_a_rank(capsys) -> None:
    data = search_json(capsys, *TIGHT, "--top", "4")
    s = data["summary"]
    assert set(s) == {
        "generated",
        "refused",
        "over_memory",
        "bounded",
        "priced",
        "never_tried",
        "seconds",
    }
    assert set(s["seconds"]) == {"enumerate", "memory", "bound", "price", "total"}
    assert all(isinstance(v, int) and v > 0 for v in s["refused"].values())
    assert (
        s["generated"]
        == sum(s["refused"].values()) + s["over_memory"] + s["bounded"] + (s["priced"])
    )
    assert s["over_memory"] > 0 and s["bounded"] > 0
    assert set(data) >= {"summary", "plans"}
    plans = data["plans"]
    assert [p["rank"] for p in plans] == [1, 2, 3, 4]
    steps = [p["time"]["step_s"] for p in plans]
    assert steps == sorted(steps)
    mixed = 0
    for plan in plans:
        layout = plan["layout"]
        assert set(layout) >= LAYOUT_KEYS
        assert layout["recompute"] == "auto"
        code, out, err = invoke(capsys, "estimate", *TIGHT[:-2], *layout_flags(layout), "--json")
        assert code == 0, err
        est = json.loads(out)
        # exactly the estimate's shape, plus a rank
        assert set(plan) == set(est) | {"rank"}
        assert est.get("rank") is None
        assert set(plan["layout"]) == set(est["layout"])
        assert set(plan["memory"]) == set(est["memory"])
        assert set(plan["time"]) == set(est["time"])
        for key in ("tokens_per_s_per_device", "mfu", "hfu"):
            assert isinstance(plan[key], float) and plan[key] > 0
        # re-estimating the layout with --recompute auto reproduces the plan
        assert est["time"]["step_s"] == plan["time"]["step_s"]
        assert est["memory"]["peak_bytes"] == plan["memory"]["peak_bytes"]
        assert est["memory"]["peak_stage"] == plan["memory"]["peak_stage"]
        assert {k: v for k, v in est.items() if k != "rank"} == {
            k: v for k, v in plan.items() if k != "rank"
        }
        mixed += len({r["option"] for r in plan["recompute"]}) > 1
    assert mixed, "the case is meant to exercise per-layer recompute"


# ----------------------------------------------------------------------------- the table


def test_the_table_summary_line_and_assumptions(capsys) -> None:
    data = search_json(capsys, *TIGHT, "--top", "4")
    code, out, err = invoke(capsys, "search", *TIGHT, "--top", "4")
    assert code == 0, err
    header = next(line for line in out.splitlines() if "tok/s/dev" in line)
    cols = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert cols == [
        "#",
        "tp",
        "pp",
        "cp",
        "dp",
        "ep",
        "mbs×m",
        "zero",
        "sp",
        "offl",
        "recompute",
        "peak GiB",
        "step s",
        "tok/s/dev",
        "MFU",
        "time shares %",
    ]
    rows = [
        [c.strip() for c in line.strip("│ ").split("│")]
        for line in out.splitlines()
        if re.match(r"│\s*\d+\s*│", line)
    ]
    assert len(rows) == 4
    for row, plan in zip(rows, data["plans"], strict=True):
        lay, mem, t = plan["layout"], plan["memory"], plan["time"]
        pp = f"{lay['pp']}" + (f"×{lay['vpp']}" if lay["vpp"] > 1 else "")
        assert row[:8] == [
            str(plan["rank"]),
            str(lay["tp"]),
            pp,
            str(lay["cp"]),
            str(lay["dp"]),
            "",
            f"{lay['mbs']}×{lay['num_microbatches']}",
            str(lay["zero"]),
        ]
        assert row[8] == ("on" if lay["sp"] and lay["tp"] > 1 else "")
        options = {r["option"] for r in plan["recompute"]}
        assert all(o in row[10] for o in options)
        assert row[11] == f"{mem['peak_bytes'] / 2**30:.1f} (s{mem['peak_stage']})"
        assert row[12] == f"{t['step_s']:.3f}"
        assert row[13] == f"{plan['tokens_per_s_per_device']:,.0f}"
        assert row[14] == f"{100 * plan['mfu']:.1f}%"
        shares = dict(zip(row[15].split()[::2], map(int, row[15].split()[1::2]), strict=True))
        assert {"fwd", "bwd"} <= set(shares) and 95 <= sum(shares.values()) <= 105
        assert shares["fwd"] == round(100 * t["parts"]["forward"] / t["step_s"])
    s = data["summary"]
    line = next(line for line in out.splitlines() if line.startswith("generated "))
    m = re.fullmatch(
        r"generated ([\d,]+) · refused ([\d,]+)(?: \((.*)\))? · over memory ([\d,]+) · "
        r"bounded ([\d,]+) · priced ([\d,]+) · [\d.]+ s \(enumerate [\d.]+, memory [\d.]+, "
        r"bound [\d.]+, price [\d.]+\)",
        line.strip(),
    )
    assert m, line
    num = [int(g.replace(",", "")) for g in m.group(1, 2, 4, 5, 6)]
    assert num == [
        s["generated"],
        sum(s["refused"].values()),
        s["over_memory"],
        s["bounded"],
        s["priced"],
    ]
    reasons = dict(r.rsplit(" ", 1) for r in m.group(3).split(", "))
    assert {k: int(v.replace(",", "")) for k, v in reasons.items()} == s["refused"]
    assert "best plan:" in out
    assumed = [line for line in err.splitlines() if line.startswith("assumed: ")]
    assert len(assumed) == 1 and "job.precision=bf16" in assumed[0]
    assert assumed[0].removeprefix("assumed: ").split("; ") == data["assumptions"]


def test_top_k_lists_k_plans(capsys) -> None:
    assert len(search_json(capsys, *SMALL, "--top", "2")["plans"]) == 2
    assert len(search_json(capsys, *SMALL)["plans"]) == 10  # the default


# ----------------------------------------------------------------------------- the space


def ranking(capsys, tmp_path: Path, *argv: str) -> tuple[dict, list[dict[str, str]]]:
    out = tmp_path / f"ranking-{len(list(tmp_path.iterdir()))}.csv"
    data = search_json(capsys, *argv, "--exhaustive", "--ranking-csv", str(out))
    return data, read_csv(out)


@pytest.mark.parametrize(
    "vary",
    [
        ["-l", "TP,PP"],
        ["--vary", "TP", "--vary", "PP"],
        ["-l", "TP PP"],
        ["-l", "tp,pp"],
        ["-l", "TP", "PP"],
    ],
)
def test_vary_names_the_dimensions_searched(capsys, tmp_path: Path, vary) -> None:
    data, rows = ranking(capsys, tmp_path, *SMALL, *vary)
    assert {(r["tp"], r["pp"]) for r in rows} >= {("1", "1"), ("2", "2"), ("8", "1")}
    # the rest stay at their defaults
    assert {
        (r["cp"], r["mbs"], r["vpp"], r["zero"], r["recompute"], r["offload_optimizer"])
        for r in rows
    } == {("1", "1", "1", "1", "none", "False")}
    baseline = search_json(capsys, *SMALL, "-l", "TP,PP", "--exhaustive")
    assert without_seconds(data) == without_seconds(baseline)


def test_vary_takes_the_dimension_names_that_follow_it(capsys) -> None:
    """``-l TP PP`` as typed: the names after -l are folded into one value (click options
    take one word); the first word that is not a name (an option, a path) ends the list,
    and an unknown name is exit 3 naming it."""
    code, out, err = invoke(capsys, "search", *SMALL, "-l", "TP", "PP", "--json")
    assert code == 0, err
    assert {p["layout"]["cp"] for p in json.loads(out)["plans"]} == {1}  # CP not varied
    code, _, err = invoke(capsys, "search", *SMALL, "-l", "TP,XX")
    assert code == 3 and "XX" in one_error_line(err)
    # A misspelt name after the first is folded too: the same named error, with the
    # closest dimension, not click's "unexpected extra argument" (exit 2).
    code, _, err = invoke(capsys, "search", *SMALL, "-l", "TP", "PP", "OFLOAD")
    line = one_error_line(err)
    assert code == 3 and "'OFLOAD'" in line and "did you mean OFFLOAD" in line
    # A path after the names is not a dimension: click refuses it as the stray word it is.
    code, _, _ = invoke(capsys, "search", *SMALL, "-l", "TP", "space.yaml")
    assert code == 2


def test_a_fixed_degree_is_the_only_value_searched(capsys, tmp_path: Path) -> None:
    data, rows = ranking(capsys, tmp_path, *SMALL, "--tp", "8", "--top", "3")
    assert rows and {r["tp"] for r in rows} == {"8"}
    assert {p["layout"]["tp"] for p in data["plans"]} == {8}
    _, rows = ranking(capsys, tmp_path, *SMALL, "--tp", "2", "--mbs", "2", "--zero", "3")
    assert {(r["tp"], r["mbs"], r["zero"]) for r in rows} == {("2", "2", "3")}


@pytest.mark.parametrize(
    "argv",
    [
        ("--tp", "2", "-l", "TP"),
        ("--pp", "2", "-l", "TP,PP"),
        ("--recompute", "full", "--vary", "RECOMPUTE"),
    ],
)
def test_a_dimension_both_fixed_and_varied_is_invalid_input(capsys, argv) -> None:
    code, _, err = invoke(capsys, "search", *SMALL, *argv)
    assert code == 3
    assert "both fixed" in one_error_line(err)


def test_degrees_that_cannot_multiply_out_are_invalid_input(capsys) -> None:
    code, _, err = invoke(capsys, "search", *SMALL, "--tp", "3")
    assert code == 3 and "tp 3" in one_error_line(err)


def test_a_space_file_fixes_lists_and_frees_dimensions(capsys, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "tp: [1, 2]      # candidates\n"
        "pp: 1           # fixed\n"
        "cp: auto        # the planner decides\n"
        "mbs: 1\n"
        "zero: 1\n"
        "recompute: auto\n"
        "offload: false\n",
        encoding="utf-8",
    )
    _, rows = ranking(capsys, tmp_path, *SMALL, "--space", str(space))
    assert {r["tp"] for r in rows} == {"1", "2"}
    assert {(r["pp"], r["mbs"], r["zero"], r["recompute"]) for r in rows} == {
        ("1", "1", "1", "auto")
    }
    assert {r["cp"] for r in rows} == {"1", "2", "4", "8"}
    assert {r["offload_optimizer"] for r in rows} == {"False"}
    for r in rows:
        assert int(r["tp"]) * int(r["cp"]) * int(r["dp"]) == 8
    # a flag still fixes what the file lists
    _, rows = ranking(capsys, tmp_path, *SMALL, "--space", str(space), "--tp", "2")
    assert {r["tp"] for r in rows} == {"2"}


def test_listed_values_no_layout_can_take_are_named(capsys, tmp_path: Path) -> None:
    """tp 3 on 8 devices and mbs 3 of a batch of 16 are never generated: the search runs
    on the rest and says which it never tried, in the summary and on stderr."""
    space = tmp_path / "space.yaml"
    space.write_text("tp: [1, 3]\nmbs: [1, 3]\n", encoding="utf-8")
    code, out, err = invoke(capsys, "search", *SMALL, "--space", str(space), "--json")
    assert code == 0, err
    assert json.loads(out)["summary"]["never_tried"] == {"tp": [3], "mbs": [3]}
    said = "warning: never tried, as no layout of 8 devices and global batch 16 can take them"
    assert f"{said}: tp 3; mbs 3" in err
    code, out, err = invoke(capsys, "search", *SMALL, "--json")  # nothing listed: nothing named
    assert code == 0 and json.loads(out)["summary"]["never_tried"] == {}
    assert "never tried" not in err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tp: [1, 2\n", "not valid YAML"),
        ("tensor: 2\n", "unknown key"),
        ("zro: 1\n", "unknown key 'zro'; did you mean zero? (known: allow_tp_beyond"),
        ("- 1\n", "mapping"),
    ],
)
def test_a_bad_space_file_is_invalid_input(capsys, tmp_path: Path, text, says) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(text, encoding="utf-8")
    code, _, err = invoke(capsys, "search", *SMALL, "--space", str(space))
    assert code == 3 and says in one_error_line(err)
    code, _, err = invoke(capsys, "search", *SMALL, "--space", str(tmp_path / "missing.yaml"))
    assert code == 3 and "missing.yaml" in one_error_line(err)


# ----------------------------------------------------------------------------- files out


def test_strict_search_runs_once_a_job_file_states_every_setting(capsys, tmp_path: Path) -> None:
    code, _, err = invoke(capsys, "search", *SMALL, "--strict")
    assert code == 3 and "--strict forbids assuming" in err
    # The error says how to state the field; doing as it says moves on to the next one.
    stated = tmp_path / "stated.yaml"
    lines: list[str] = []
    for _ in range(3):
        suggested = re.search(r"e\.g\. '([a-z_]+): ([^']+)' in a --job file$", one_error_line(err))
        assert suggested, err
        lines.append(f"{suggested[1]}: {suggested[2]}")
        stated.write_text("\n".join(lines) + "\n", encoding="utf-8")
        code, _, err = invoke(capsys, "search", *SMALL, "--strict", "--job", str(stated))
        assert code == 3 and f"job.{suggested[1]}:" not in err
    job = tmp_path / "job.yaml"
    job.write_text(
        "precision: bf16\noptimizer: adam\nframework: megatron\nattention_kernel: flash\n"
        "dropout: 0.0\ncp_kind: ring\nfused_loss: true\ngrad_reduce_dtype: fp32\n"
        "finetune: full\nmoe_capacity_factor: 1.0\ntp_comm_overlap: true\n"
        "fp8_param_gather: true\nactivation_offload: false\ndefer_embedding_wgrad: false\n",
        encoding="utf-8",
    )
    strict = search_json(capsys, *SMALL, "--job", str(job), "--strict")
    assumed = search_json(capsys, *SMALL)
    assert strict.pop("assumptions") == [] and assumed.pop("assumptions")
    strict["summary"].pop("seconds"), assumed["summary"].pop("seconds")
    assert strict == assumed  # the file states the defaults the plain search assumed


def test_the_ranking_csv_lists_every_kept_plan_in_rank_order(capsys, tmp_path: Path) -> None:
    out = tmp_path / "ranking.csv"
    data = search_json(capsys, *TIGHT, "--top", "3", "--ranking-csv", str(out))
    rows = read_csv(out)
    header = list(rows[0])
    assert header[: 1 + len(FIELDS) + 4] == [
        "rank",
        *FIELDS,
        "layers_per_chunk",
        "step_s",
        "peak_bytes",
        "peak_stage",
    ]
    assert any(h.startswith("time.") for h in header) and any(
        h.startswith("memory.") for h in header
    )
    assert [int(r["rank"]) for r in rows] == list(range(1, len(rows) + 1))
    # The bounded search ranks exactly the plans no candidate it bounded out could beat:
    # at least the top K, and they are the unpruned ranking's first rows, in its order
    # (it priced others past them, whose ranks it cannot know: they are left out).
    assert data["summary"]["bounded"] > 0 and 3 <= len(rows) <= data["summary"]["priced"]
    unpruned = tmp_path / "unpruned.csv"
    every = search_json(capsys, *TIGHT, "--exhaustive", "--ranking-csv", str(unpruned))
    all_rows = read_csv(unpruned)
    assert every["summary"]["bounded"] == 0 and len(all_rows) <= every["summary"]["priced"]

    # The files' part columns differ (each has those its plans hold); a part a plan lacks
    # is 0, never a blank (only an even split's layers_per_chunk is empty).
    common = [k for k in rows[0] if k in all_rows[0]]
    assert [{k: r[k] for k in common} for r in rows] == [
        {k: r[k] for k in common} for r in all_rows[: len(rows)]
    ]
    for k in set(all_rows[0]) - set(common):
        assert {r[k] for r in all_rows[: len(rows)]} == {"0"}, k
    for table in (rows, all_rows):
        assert {k for r in table for k, v in r.items() if v == ""} <= {"layers_per_chunk"}
    assert len(all_rows) > len(rows)
    assert float(all_rows[len(rows)]["step_s"]) >= float(rows[-1]["step_s"])
    steps = [float(r["step_s"]) for r in rows]
    assert steps == sorted(steps)
    for row, plan in zip(rows, data["plans"], strict=False):
        assert {k: row[k] for k in LAYOUT_KEYS} == {
            k: str(v) for k, v in plan["layout"].items() if k in LAYOUT_KEYS
        }
        assert float(row["step_s"]) == plan["time"]["step_s"]
        assert int(row["peak_bytes"]) == plan["memory"]["peak_bytes"]
        counts = plan["layout"]["layers_per_stage"]
        assert row["layers_per_chunk"] == (",".join(map(str, counts)) if counts else "")


def test_the_ranking_csv_is_never_overwritten_without_force(capsys, tmp_path: Path) -> None:
    out = tmp_path / "ranking.csv"
    out.write_text("keep me\n", encoding="utf-8")
    code, stdout, err = invoke(capsys, "search", *SMALL, "--ranking-csv", str(out))
    assert code == 3 and "--force" in one_error_line(err) and stdout == ""
    assert out.read_text(encoding="utf-8") == "keep me\n"
    code, _, err = invoke(capsys, "search", *SMALL, "--ranking-csv", str(out), "--force", "--json")
    assert code == 0, err
    assert read_csv(out)[0]["rank"] == "1"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def _as_csv(row: dict, header: list[str], missing: object = "") -> dict[str, str]:
    return {
        k: repr(row[k]) if isinstance(row.get(k), float) else str(row.get(k, missing))
        for k in header
    }


def _merged(candidate: dict, parts: dict, kind: str) -> dict:
    """A debug CSV row: the candidate's fields intact, a part named like one prefixed."""
    return {**candidate, **{(f"{kind}.{k}" if k in candidate else k): v for k, v in parts.items()}}


def test_debug_sinks_builtin_and_a_plugins_get_the_same_records(capsys, tmp_path: Path) -> None:
    search_sink = pytest.importorskip("search_sink")
    debug = tmp_path / "debug"
    ranked = tmp_path / "ranking.csv"
    code, out, err = invoke(
        capsys,
        *("-p", "search_sink", "search", *TIGHT, "--json", "--top", "3"),
        *("--debug-dir", str(debug)),
        *("--debug-sink", "csv", "--debug-sink", "jsonl", "--debug-sink", "recorder"),
    )
    assert code == 0, err
    summary = json.loads(out)["summary"]
    assert sorted(p.name for p in debug.iterdir()) == [
        "debug.jsonl",
        "debug_mem.csv",
        "debug_perf.csv",
        "debug_refusals.csv",
    ]
    sink = search_sink.SINKS[-1]
    assert sink.opened and sink.closed and sink.directory == debug
    records = sink.records
    # one memory and one time row per priced candidate, in the search's order
    mem, perf = read_csv(debug / "debug_mem.csv"), read_csv(debug / "debug_perf.csv")
    assert len(mem) == len(perf) == summary["priced"]
    assert [[r[f] for f in FIELDS] for r in mem] == [[r[f] for f in FIELDS] for r in perf]
    # A part a stage lacks is 0 bytes there (seconds for time parts), not a blank; the
    # peak stage and the total close each row, and the parts add up to it.
    assert mem == [
        _as_csv(_merged(c, p, k), list(mem[0]), 0) for k, c, p in records if k == "memory"
    ]
    assert perf == [
        _as_csv(_merged(c, p, k), list(perf[0]), 0) for k, c, p in records if k == "time"
    ]
    assert list(mem[0])[-2:] == ["stage", "total"] and list(perf[0])[-1] == "step"
    parts = list(mem[0])[len(FIELDS) : -2]
    assert all(sum(int(r[k]) for k in parts) == int(r["total"]) for r in mem)
    assert len({r["stage"] for r in mem}) > 1  # stages with different parts, one file
    # the candidate's recompute policy survives next to the recompute seconds
    assert {r["recompute"] for r in perf} == {"auto"}
    assert all(float(r["time.recompute"]) >= 0 for r in perf)
    refusals = read_csv(debug / "debug_refusals.csv")
    assert refusals == [
        _as_csv({**c, "reason": r}, list(refusals[0])) for k, c, r in records if k == "refusal"
    ]
    jsonl = [json.loads(line) for line in (debug / "debug.jsonl").read_text().splitlines()]
    assert jsonl == [
        json.loads(
            json.dumps({"record": k, "candidate": c, ("reason" if k == "refusal" else "parts"): p})
        )
        for k, c, p in records
    ]
    # refusals by reason, as the summary counts them
    reasons = [r["reason"] for r in refusals]
    for name, count in summary["refused"].items():
        assert reasons.count(name) == count
    over = [r for r in reasons if r.startswith("over_memory (")]
    assert len(over) == summary["over_memory"] > 0
    assert all(re.fullmatch(r"over_memory \(stage \d+ by \d+\.\d\d GiB\)", r) for r in over)
    assert reasons.count("bounded") == summary["bounded"] > 0
    assert len(reasons) == sum(summary["refused"].values()) + len(over) + summary["bounded"]
    # the plans ranked exactly are priced candidates, with the same step times
    code, _, err = invoke(capsys, "search", *TIGHT, "--top", "3", "--ranking-csv", str(ranked))
    assert code == 0, err
    steps = {tuple(r[f] for f in FIELDS): r["step_s"] for r in read_csv(ranked)}
    priced = {tuple(r[f] for f in FIELDS): r["step"] for r in perf}
    assert len(steps) >= 3 and {key: priced[key] for key in steps} == steps


def test_debug_dir_alone_writes_the_csv_files(capsys, tmp_path: Path) -> None:
    code, _, err = invoke(capsys, "search", *SMALL, "--json", "--debug-dir", str(tmp_path / "d"))
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert names == ["debug_mem.csv", "debug_perf.csv", "debug_refusals.csv"]


def test_a_debug_sink_without_a_folder_is_invalid_input(capsys) -> None:
    code, _, err = invoke(capsys, "search", *SMALL, "--json", "--debug-sink", "jsonl")
    assert code == 3 and "--debug-dir" in one_error_line(err)
    code, _, err = invoke(capsys, "search", *SMALL, "--debug-dir", "x", "--debug-sink", "nope")
    assert code == 3 and "nope" in one_error_line(err)


def test_a_plugins_refusal_rule_is_counted_by_name(capsys) -> None:
    search_rules = pytest.importorskip("search_rules")
    free = search_json(capsys, *SMALL, "--exhaustive")
    search_rules.CALLS.clear()
    code, out, err = invoke(
        capsys, "-p", "search_rules", "search", *SMALL, "--exhaustive", "--json"
    )
    assert code == 0, err
    ruled = json.loads(out)
    assert search_rules.CALLS, "the rule was never asked"
    n = ruled["summary"]["refused"]["search_rules_no_cp"]
    assert n > 0
    assert ruled["summary"]["generated"] == free["summary"]["generated"]
    assert all(p["layout"]["cp"] == 1 for p in ruled["plans"])
    # what the rule refused is exactly what it no longer prices
    assert free["summary"]["priced"] + free["summary"]["over_memory"] == (
        ruled["summary"]["priced"] + ruled["summary"]["over_memory"] + n
    )


# ----------------------------------------------------------------------------- no plan


def test_nothing_fits_exits_1_naming_the_closest_miss_as_estimate_prices_it(capsys) -> None:
    problem = ("-m", "llama-3-70b", "-d", "h100", "-n", "8", "--gbs", "32", "-s", "4096")
    code, out, err = invoke(capsys, "search", *problem, "--max-mem", "5", "-j", "1")
    assert code == 1 and out == ""
    line = one_error_line(err)
    m = re.search(
        r"closest: (?P<deg>[a-z0-9 ]+) \((?P<extra>[^)]*)\) is over by (?P<by>\d+\.\d\d) GiB "
        r"on stage (?P<stage>\d+)$",
        line,
    )
    assert m, line
    words = m["deg"].split()
    degrees = dict(zip(words[::2], words[1::2], strict=True))
    extra = m["extra"].split(", ")
    flags = []
    for key, value in degrees.items():
        flags += [f"--{key}", value]
    flags += ["--sp" if extra[0] == "sp on" else "--no-sp", "--schedule", extra[1]]
    flags += ["--recompute", extra[2].removeprefix("recompute ")]
    if "optimizer offloaded" in extra:
        flags.append("--offload-optimizer")
    code, out, err = invoke(capsys, "estimate", *problem, "--max-mem", "5", *flags, "--json")
    assert code == 0, err
    est = json.loads(out)["memory"]
    assert not est["fits"]
    assert f"{(est['peak_bytes'] - est['budget_bytes']) / 2**30:.2f}" == m["by"]
    assert est["peak_stage"] == int(m["stage"])


@pytest.mark.parametrize(
    ("argv", "divisor"),
    [
        (("-n", "8", "--gbs", "7", "--dp", "2"), 2),  # a prime batch, dp fixed
        (("-n", "8", "--gbs", "4", "--tp", "1", "--pp", "1", "--cp", "1"), 8),  # dp 8 > gbs
        (("-n", "16", "--gbs", "7", "--dp", "2"), 2),  # was exit 1 (tp 16 refused first)
    ],
)
def test_an_unreachable_batch_exits_3_listing_reachable_ones(capsys, argv, divisor) -> None:
    base = ("-m", "llama-3-8b", "-d", "h100", "-s", "2048", "-j", "1")
    code, _, err = invoke(capsys, "search", *base, *argv)
    assert code == 3
    line = one_error_line(err)
    listed = [int(v) for v in line.split("reachable batches near it: ")[1].split(", ")]
    assert listed and all(v % divisor == 0 for v in listed)
    fixed = list(argv)
    fixed[fixed.index("--gbs") + 1] = str(listed[0])
    code, _, err = invoke(capsys, "search", *base, *fixed, "--json", "--top", "1")
    assert code == 0, err


# ----------------------------------------------------------------------------- demo


def test_demo_runs_and_prints_a_ranking(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NDPLAN_JOBS", "1")
    code, out, err = invoke(capsys, "demo")
    assert code == 0, err
    assert "best layouts" in out and "Llama 3 70B on 64" in out
    assert re.search(r"│\s*1\s*│", out) and "generated " in out
    assert err.startswith("ndplan demo: ")


# ----------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_inside_a_compiled_kernel_is_an_interrupt(capsys, monkeypatch) -> None:
    """A KeyboardInterrupt raised inside a numba kernel surfaces as a SystemError caused
    by it ("... returned a result with an exception set"): still exit 130, one line."""

    def interrupted(self, candidates):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError(
                "CPUDispatcher(<function dp_choose>) returned a result with an exception set"
            ) from exc

    monkeypatch.setattr(SearchPricing, "price", interrupted)
    code, out, err = invoke(capsys, "search", *SMALL, "--json")
    assert (code, out) == (130, "")
    assert one_error_line(err) == "ndplan: error: interrupted"


def test_ctrl_c_while_searching_says_so(capsys, monkeypatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Planner, "search", interrupted)
    code, out, err = invoke(capsys, "search", *SMALL, "--json")
    assert (code, out) == (130, "")
    assert one_error_line(err) == "ndplan: error: interrupted"


def test_explain_breaks_down_the_plan_of_a_rank(capsys, tmp_path: Path) -> None:
    """--explain RANK prints that plan's breakdown instead of the best's; a rank beyond
    -t, or beyond the plans that fit, is refused in one line with nothing written."""
    plans = search_json(capsys, *TIGHT, "-t", "5")["plans"]
    code, out, err = invoke(capsys, "search", *TIGHT, "-t", "5", "--explain", "3")
    assert code == 0, err
    assert "plan 3:" in out and "best plan:" not in out
    third = plans[2]["layout"]
    shown = out.split("plan 3:", 1)[1]
    assert f"mbs {third['mbs']} × {third['num_microbatches']} · zero {third['zero']}" in shown
    _, best_out, _ = invoke(capsys, "search", *TIGHT, "-t", "5")
    assert "best plan:" in best_out  # rank 1 is the default
    csv = tmp_path / "ranking.csv"
    code, out, err = invoke(
        capsys, "search", *TIGHT, "-t", "5", "--explain", "6", "--ranking-csv", str(csv)
    )
    assert code == 3 and out == "" and not csv.exists()
    assert "--explain 6: only the top 5 plans are kept; pass -t 6" in one_error_line(err)
    # With these degrees fixed, two of the four candidates fit in 24 GiB: no rank 3.
    fixed = ("--tp", "8", "--pp", "1", "--mbs", "1", "--zero", "1", "--recompute", "none")
    code, out, err = invoke(
        capsys, "search", *TIGHT, *fixed, "--explain", "3", "--ranking-csv", str(csv)
    )
    assert code == 3 and out == "" and not csv.exists()
    assert "--explain 3: only 2 plans fit; pick a rank up to 2" in one_error_line(err)


def test_ranked_plans_whose_pipelines_never_fill_are_named(capsys) -> None:
    """The warning names exactly the listed ranks that run fewer micro-batches than
    pipeline stages."""
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "8", "-s", "4096")
    argv += ("-t", "8", "-l", "PP,MBS,DP", "-j", "1")
    plans = search_json(capsys, *argv)["plans"]
    unfilled = [
        str(p["rank"])
        for p in plans
        if p["layout"]["pp"] > 1 and p["layout"]["num_microbatches"] < p["layout"]["pp"]
    ]
    assert len(unfilled) > 1  # the case exercises it
    code, _, err = invoke(capsys, "search", *argv)
    assert code == 0
    assert f"warning: ranks {', '.join(unfilled)} run fewer micro-batches" in err


def test_the_unfilled_pipeline_warning_reads_by_count() -> None:
    def plans(*pp_m: tuple[int, int]) -> list:
        return [SimpleNamespace(layout=Layout(pp=pp, dp=1, num_microbatches=m)) for pp, m in pp_m]

    assert unfilled_pipeline_warning(plans((1, 1), (4, 4), (2, 8))) is None
    assert unfilled_pipeline_warning(plans((4, 2))) == (
        "warning: 2 micro-batches for 4 pipeline stages: the pipeline never fills; "
        "raise --gbs, or lower --mbs, --dp or --pp"
    )
    assert unfilled_pipeline_warning(plans((1, 1), (4, 2), (4, 4))) == (
        "warning: rank 2 runs fewer micro-batches than pipeline stages: its pipeline never fills"
    )
    assert unfilled_pipeline_warning(plans((8, 2), (1, 1), (4, 2))) == (
        "warning: ranks 1, 3 run fewer micro-batches than pipeline stages: "
        "their pipelines never fill"
    )
    many = unfilled_pipeline_warning(plans(*[(4, 2)] * 250))
    assert many == (
        "warning: ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 240 more run fewer micro-batches "
        "than pipeline stages: their pipelines never fill"
    )


@pytest.mark.parametrize(("device", "precision"), [("a100", "fp8"), ("h100", "fp4")])
def test_a_precision_the_device_cannot_run_is_invalid_input(
    capsys, tmp_path: Path, device: str, precision: str
) -> None:
    """The search refuses it up front, as estimate does (it had failed inside pricing with
    an internal error), with nothing written."""
    csv = tmp_path / "ranking.csv"
    for command in ("search", "estimate"):
        extra = ("--ranking-csv", str(csv)) if command == "search" else ()
        code, out, err = invoke(
            capsys,
            command,
            *("-m", "llama-3-8b", "-d", device, "-n", "8", "--gbs", "32", "-s", "4096"),
            *("--precision", precision, *extra),
        )
        assert code == 3 and out == "" and not csv.exists()
        line = one_error_line(err)
        assert f"precision '{precision}' needs {precision} tensor cores" in line
        assert line.endswith("does not have; use bf16")


def test_the_debug_folder_is_a_folder_and_an_earlier_runs_files_are_kept(
    capsys, tmp_path: Path
) -> None:
    """Checked before the search: a file given as the folder, or an earlier run's debug
    files without --force, is invalid input and nothing is touched."""
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    code, out, err = invoke(capsys, "search", *SMALL, "--debug-dir", str(a_file))
    assert code == 3 and out == "" and a_file.read_text() == "mine"
    assert f"--debug-dir {a_file}: is a file; give a folder" in one_error_line(err)
    debug = tmp_path / "debug"
    code, _, err = invoke(capsys, "search", *SMALL, "--json", "--debug-dir", str(debug))
    assert code == 0, err
    (debug / "debug_mem.csv").write_text("kept")
    code, out, err = invoke(capsys, "search", *SMALL, "--json", "--debug-dir", str(debug))
    assert code == 3 and out == "" and (debug / "debug_mem.csv").read_text() == "kept"
    assert "holds debug_mem.csv from an earlier run; pass --force" in one_error_line(err)
    code, _, err = invoke(capsys, "search", *SMALL, "--json", "--debug-dir", str(debug), "--force")
    assert code == 0, err
    assert (debug / "debug_mem.csv").read_text() != "kept"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--reserve", "500", "--reserve: 500 GiB leaves nothing of the 80.00 GiB per device"),
        (
            "--runtime-reserve",
            "100",
            "--runtime-reserve: 100 GiB leaves nothing of the 80.00 GiB per device to plan in",
        ),
    ],
)
def test_a_reserve_that_leaves_no_memory_is_invalid_input(
    capsys, flag: str, value: str, message: str
) -> None:
    for command in ("search", "estimate"):
        code, out, err = invoke(capsys, command, *TIGHT[:10], flag, value)  # no --max-mem
        assert code == 3 and out == ""
        assert message in one_error_line(err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--ep", "2"), "ep(2) but the model has no experts; use --ep 1"),
        (("--etp", "2"), "etp(2) is set but the model has no experts; drop --etp"),
    ],
)
def test_expert_degrees_for_a_dense_model_are_invalid_input(
    capsys, tmp_path: Path, argv: tuple[str, ...], message: str
) -> None:
    """Expert degrees shard nothing in a dense model: search refuses them (as a flag or in
    --space) as estimate does, instead of reporting no layout or showing an unused etp."""
    code, out, err = invoke(capsys, "search", *SMALL, *argv)
    assert code == 3 and out == "" and message in one_error_line(err)
    space = tmp_path / "space.yaml"
    space.write_text(f"{argv[0].removeprefix('--')}: [1, 2]\n")
    code, out, err = invoke(capsys, "search", *SMALL, "--space", str(space))
    assert code == 3 and out == "" and "the model has no experts" in one_error_line(err)
    code, out, err = invoke(capsys, "estimate", *SMALL[:10], *argv)
    assert code == 3 and out == "" and "the model has no experts" in one_error_line(err)


def _ranked(*steps: float, shapes: tuple | None = None) -> list:
    """Plans with these step times, each of its own device grid unless ``shapes`` says."""
    shapes = shapes or tuple(range(len(steps)))
    return [
        SimpleNamespace(time=SimpleNamespace(step_s=s), layout=SimpleNamespace(shape=g))
        for s, g in zip(steps, shapes, strict=True)
    ]


def test_the_near_tie_note_counts_the_ranks_inside_the_median_error() -> None:
    # 4 % error: 100, 102 and 104 s are a tie, 106 s is not.
    assert near_tie_note(_ranked(100, 102, 104, 106), 0.04, top=4) == (
        "ranks 1-3 are within 4.0 % of the best step time, less than the calibration's "
        "median error on the runs it was fitted to (4.0 %): their order is uncertain; "
        "weigh memory headroom and simplicity too"
    )
    # Every kept plan inside the band: more may follow past -t.
    assert "all 3 listed plans are within 2.0 %" in near_tie_note(
        _ranked(100, 101, 102), 0.04, top=3
    )
    assert "more may lie beyond -t 3" in near_tie_note(_ranked(100, 101, 102), 0.04, top=3)
    # Fewer plans fit than -t asked for: nothing lies beyond them.
    fewer = near_tie_note(_ranked(100, 101), 0.04, top=5)
    assert fewer.startswith("ranks 1-2 are within 1.0 %") and "beyond" not in fewer
    # Rank 2 outside the band, one plan, or no stated error: no note.
    assert near_tie_note(_ranked(100, 105, 105.5), 0.04, top=3) is None
    assert near_tie_note(_ranked(100), 0.04, top=1) is None
    assert near_tie_note(_ranked(100, 100.5), None, top=2) is None


def test_the_near_tie_note_points_to_one_plan_per_shape_when_variants_fill_the_band() -> None:
    variants = _ranked(100, 101, 102, 110, shapes=("a", "a", "b", "c"))
    assert near_tie_note(variants, 0.04, top=4).endswith(
        "weigh memory headroom and simplicity too "
        "(2 shapes among them: --distinct lists one plan per shape)"
    )
    assert "--distinct" not in near_tie_note(_ranked(100, 101, 102), 0.04, top=3)
    one_shape = _ranked(100, 101, 102, shapes=("a", "a", "a"))
    assert near_tie_note(one_shape, 0.04, top=3).endswith(
        "(all of one shape: --distinct lists one plan per shape)"
    )


def test_distinct_lists_the_fastest_plan_of_each_shape(capsys, tmp_path: Path) -> None:
    """--distinct: ranks 1..K are K different device grids, each the fastest layout of its
    grid in the full ranking (--ranking-csv keeps every plan), in step-time order."""
    csv_path = tmp_path / "ranking.csv"
    data = search_json(capsys, *TIGHT, "--top", "5", "--distinct", "--ranking-csv", str(csv_path))
    assert data["summary"]["distinct"] is True
    plans = data["plans"]
    grid = ("tp", "pp", "cp", "dp", "ep", "etp")
    shapes = [tuple(p["layout"][d] or p["layout"]["tp"] for d in grid) for p in plans]
    assert len(plans) == 5 and len(set(shapes)) == 5
    assert [p["rank"] for p in plans] == [1, 2, 3, 4, 5]
    steps = [p["time"]["step_s"] for p in plans]
    assert steps == sorted(steps)
    rows = read_csv(csv_path)
    fastest: dict[tuple, float] = {}
    for row in rows:  # rank order: the first row of a grid is its fastest
        key = tuple(int(row[d]) for d in grid)
        fastest.setdefault(key, float(row["step_s"]))
    assert len(rows) > len(fastest)  # the case has several layouts of one grid
    assert steps == sorted(fastest.values())[:5]
    assert [fastest[s] for s in shapes] == steps
    # Without the flag the summary is as ever, and the list holds variants of fewer grids.
    plain = search_json(capsys, *TIGHT, "--top", "5")
    assert "distinct" not in plain["summary"]
    assert (
        len({tuple(p["layout"][d] or p["layout"]["tp"] for d in grid) for p in plain["plans"]}) < 5
    )
    code, out, err = invoke(capsys, "search", *TIGHT, "--top", "5", "--distinct")
    assert code == 0, err
    assert "best layouts, one per shape" in out


@pytest.mark.parametrize(
    ("args", "moe"),
    [
        (TIGHT, False),
        (("-m", "qwen3-30b-a3b", "-d", "h100", "-n", "8", "--gbs", "64", "-s", "4096"), True),
    ],
    ids=["dense", "moe"],
)
def test_the_near_tie_note_uses_the_calibrations_fitted_error(
    capsys, tmp_path: Path, args: tuple[str, ...], moe: bool
) -> None:
    """The shipped calibration states its median error on the fitted runs of each model
    class, and the note quotes the planned model's class, over the table's own step
    times; a calibration stating only the overall error quotes that, and one without fit
    figures prints no note."""
    data = search_json(capsys, *args, "--top", "6")
    calibration = Planner().calibration(None)
    median, runs = calibration.class_median_error(moe)
    assert runs == ("MoE" if moe else "dense")
    assert median is not None and 0 < median < 0.2
    # MoE rows err more than dense ones, so the two notes must differ.
    assert median != calibration.class_median_error(not moe)[0]
    steps = [p["time"]["step_s"] for p in data["plans"]]
    close = sum(s <= steps[0] * (1 + median) for s in steps)
    assert close >= 2  # the case exercises it
    code, out, err = invoke(capsys, "search", *args, "--top", "6")
    assert code == 0, err
    who = "all 6 listed plans are" if close == 6 else f"ranks 1-{close} are"
    out = " ".join(out.split())  # the note wraps at the terminal's width
    assert f"{who} within " in out
    assert f"median error on the {runs} runs it was fitted to ({100 * median:.1f} %)" in out
    # The shipped calibration as a file stating only the overall error (as older fits do).
    stated = calibration.model_dump(mode="json")
    for class_key in (median_error_key(False), median_error_key(True)):
        del stated["fit"][class_key]
    overall = tmp_path / "overall.json"
    overall.write_text(json.dumps(stated))
    median = calibration.median_error
    code, out, err = invoke(capsys, "search", *args, "--top", "6", "--calibration", str(overall))
    assert code == 0, err
    assert f"median error on the runs it was fitted to ({100 * median:.1f} %)" in " ".join(
        out.split()
    )
    bare = tmp_path / "calibration.json"
    bare.write_text("{}")
    code, out, err = invoke(capsys, "search", *args, "--top", "6", "--calibration", str(bare))
    assert code == 0, err
    assert "median error" not in out


def test_the_best_plans_layers_by_stage_when_it_recomputes_nothing(capsys) -> None:
    """A best plan with no recompute ranges to show lists the layers of each stage; one
    whose recompute varies shows them in its recompute ranges instead."""
    code, out, err = invoke(capsys, "search", *SMALL, "--pp", "2", "--recompute", "none")
    assert code == 0, err
    lines = out.splitlines()
    at = lines.index("layers by stage:")
    stage0, stage1 = lines[at + 1 : at + 3]
    assert stage0.startswith("  stage 0: layers ") and stage0.endswith(" · embedding")
    assert stage1.startswith("  stage 1: layers ") and stage1.endswith(" · output layer and loss")
    held = []  # every decoder layer on exactly one stage
    for line in (stage0, stage1):
        for span in line.split(": layers ")[1].split(" · ")[0].split(", "):
            first, _, last = span.partition("-")
            held += range(int(first), int(last or first) + 1)
    assert sorted(held) == list(range(32))
    code, out, err = invoke(capsys, "search", *TIGHT, "--pp", "2")
    assert code == 0, err
    assert "recompute:" in out.splitlines() and "layers by stage:" not in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ("-n", "16", "--gbs", "16", "-s", "2048", "--tp", "16"),
            "every layout in the search space is refused (tp_beyond_scale_up_domain 1); relax "
            "the fixed values these rules refuse (a TP beyond the 8-device scale-up domain "
            "needs --max-tp)",
        ),
        (
            ("-n", "8", "--gbs", "64", "-s", "2047", "--cp", "2"),
            "every layout in the search space is refused (cp_not_dividing_sequence 6); relax "
            "the fixed values these rules refuse",
        ),
        (
            ("-n", "64", "--gbs", "64", "-s", "2048", "--pp", "64"),
            "every layout in the search space is refused (pp_exceeds_layers 1, "
            "tp_beyond_scale_up_domain 3); relax the fixed values these rules refuse",
        ),
        # No tp·pp·cp·dp of 64 has cp 3, though rules refused other degrees first.
        (
            ("-n", "64", "--gbs", "64", "-s", "2048", "--cp", "3"),
            "no layout of 64 devices matches the search space (cp 3, ep 1,",
        ),
    ],
)
def test_a_space_every_rule_refuses_is_invalid_input_naming_the_rules(
    capsys, tmp_path: Path, argv, says
) -> None:
    csv_out = tmp_path / "ranking.csv"
    code, out, err = invoke(
        capsys, "search", "-m", "llama-3-8b", "-d", "h100", *argv, "--ranking-csv", str(csv_out)
    )
    assert code == 3 and out == "" and not csv_out.exists()
    assert one_error_line(err).startswith(f"ndplan: error: {says}")


def test_the_ep_column_names_an_expert_tp_that_differs_from_tp() -> None:
    from ndplan.cli.search import expert_cell

    def lay(tp: int, ep: int, etp: int | None) -> SimpleNamespace:
        return SimpleNamespace(tp=tp, ep=ep, expert_tp=etp if etp is not None else tp)

    assert expert_cell(lay(2, 1, None)) == ""  # dense, or experts not split
    assert expert_cell(lay(2, 8, None)) == "8"
    assert expert_cell(lay(1, 8, 2)) == "8 etp2"
    assert expert_cell(lay(4, 1, 1)) == "1 etp1"


# ----------------------------------------------------------------------------- --baseline

GRID = ("tp", "pp", "cp", "dp", "ep", "etp")


def test_a_baseline_is_placed_exactly_in_the_ranking(capsys, tmp_path: Path) -> None:
    """--baseline tp=2,pp=2: the fastest layout with those degrees, its rank among every
    ranked layout (the ranking CSV's first row with them), its gap to the best, the other
    grids ahead of it; the listed plans are the search's without the flag."""
    csv_path = tmp_path / "ranking.csv"
    data = search_json(
        capsys, *TIGHT, "--top", "3", "--baseline", "tp=2,pp=2", "--ranking-csv", str(csv_path)
    )
    placed = data["baseline"]
    rows = read_csv(csv_path)
    at = next(i for i, r in enumerate(rows) if (r["tp"], r["pp"]) == ("2", "2"))
    assert at >= 3  # beyond the top 3, so the search priced past them to place it
    assert placed["stated"] == {"tp": 2, "pp": 2}
    assert placed["rank"] == at + 1 == placed["plan"]["rank"]
    assert (placed["plan"]["layout"]["tp"], placed["plan"]["layout"]["pp"]) == (2, 2)
    assert placed["plan"]["time"]["step_s"] == pytest.approx(float(rows[at]["step_s"]), rel=1e-9)
    best = data["plans"][0]["time"]["step_s"]
    assert placed["gap"] == pytest.approx(placed["plan"]["time"]["step_s"] / best - 1)
    grids = {tuple(r[d] for d in GRID) for r in rows[:at]} - {tuple(rows[at][d] for d in GRID)}
    assert placed["grids_ahead"] == len(grids) > 0
    plain = search_json(capsys, *TIGHT, "--top", "3")
    assert "baseline" not in plain and plain["plans"] == data["plans"]
    assert "priced_for_baseline" not in plain["summary"]
    # Without the CSV (which prices every plan) the search prices past the top K only as
    # far as the baseline needs, and says how many that took.
    bounded = search_json(capsys, *TIGHT, "--top", "3", "--baseline", "tp=2,pp=2")
    assert bounded["baseline"] == placed and bounded["plans"] == data["plans"]
    extra = bounded["summary"]["priced_for_baseline"]
    assert bounded["summary"]["priced"] - extra == plain["summary"]["priced"] and extra > 0
    code, out, err = invoke(capsys, "search", *TIGHT, "--top", "3", "--baseline", "tp=2 pp=2")
    assert code == 0, err
    lines = out.splitlines()
    line = next(line for line in lines if line.startswith("baseline "))
    label = layout_label(placed["plan"]["layout"])
    assert line.startswith(
        f"baseline (tp=2 pp=2): {label} ranks {at + 1} ({at} layouts are faster; "
    )
    assert f"{100 * placed['gap']:+.1f} % over the best; largest difference: " in line
    assert f" · priced {bounded['summary']['priced']:,} ({extra:,} to place the baseline) · " in out
    # Its step-time parts beside the best plan's: the differences add up to the gap.
    title = [line.rstrip() for line in lines].index("baseline against the best, seconds per step")
    cells = {}
    for row in lines[title + 3 :]:
        if row.startswith("└"):
            break
        if row.startswith("│"):
            name, best_s, base_s, delta = (c.strip() for c in row.split("│")[1:5])
            cells[name] = (float(best_s), float(base_s), float(delta))
    step = cells.pop("step")
    assert step[1] == round(placed["plan"]["time"]["step_s"], 3)
    assert step[0] == round(data["plans"][0]["time"]["step_s"], 3)
    assert cells.pop("peak memory, GiB")[1] == round(
        placed["plan"]["memory"]["peak_bytes"] / 2**30, 1
    )
    assert sum(d for _, _, d in cells.values()) == pytest.approx(step[2], abs=0.001 * len(cells))
    # The table shows it below a rule, unless it is listed already.
    at_base = next(i for i, line in enumerate(lines) if line.startswith("│base "))
    assert lines[at_base - 1].startswith("├") and lines[at_base + 1].startswith("└")
    tp_cell, pp_cell = (c.strip() for c in lines[at_base].split("│")[2:4])
    assert tp_cell == "2" and pp_cell.rstrip("*").split("×")[0] == "2"
    code, out, err = invoke(
        capsys, "search", *TIGHT, "--top", str(at + 1), "--baseline", "tp=2,pp=2"
    )
    assert code == 0, err
    assert "│base" not in out and f"ranks {at + 1} (" in out


def test_a_baseline_file_takes_a_plan_as_estimate_prints_it(capsys, tmp_path: Path) -> None:
    """An `estimate --json` output as the baseline: every degree it states is kept, and the
    search places the fastest layer split of that layout."""
    flags = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "32", "-s", "4096")
    code, out, err = invoke(
        capsys,
        "estimate",
        *flags,
        "--max-mem",
        "24",
        *("--tp", "4", "--pp", "2", "--vpp", "2", "--recompute", "full", "--json"),
    )
    assert code == 0, err
    estimate = json.loads(out)
    mine = tmp_path / "mine.json"
    mine.write_text(out, encoding="utf-8")
    data = search_json(capsys, *TIGHT, "--top", "3", "--baseline", str(mine))
    placed = data["baseline"]
    for key in ("tp", "pp", "vpp", "cp", "dp", "mbs", "zero", "sp", "schedule", "recompute"):
        assert placed["plan"]["layout"][key] == estimate["layout"][key], key
    assert placed["stated"]["recompute"] == "full" and "num_microbatches" not in placed["stated"]
    assert placed["plan"]["time"]["step_s"] <= estimate["time"]["step_s"] * (1 + 1e-12)
    assert placed["rank"] > 3


@pytest.mark.parametrize("name", ["args.yaml", "args.out"])
def test_megatron_arguments_by_name_are_a_baseline_whatever_the_file_is_named(
    capsys, tmp_path: Path, name: str
) -> None:
    """Megatron's arguments as a mapping of their argparse names (a launcher's dump of
    them) place that layout, under a name that says nothing of the format as under .yaml."""
    target = tmp_path / name
    target.write_text(
        "tensor_model_parallel_size: 4\npipeline_model_parallel_size: 2\nmicro_batch_size: 1\n",
        encoding="utf-8",
    )
    placed = search_json(capsys, *SMALL, "--baseline", str(target))["baseline"]
    lay = placed["plan"]["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["mbs"]) == (4, 2, 1, 1)


def test_a_baseline_reads_a_layout_as_ndplan_prints_it(capsys) -> None:
    """The label the baseline line prints (tp2 pp2×2 cp1 dp2 mbs1 z1) is a baseline too: it
    places that very layout; ``pp2×?`` leaves VPP to the search as ``tp=2,pp=2`` does."""
    data = search_json(capsys, *TIGHT, "--top", "3", "--baseline", "tp=2,pp=2")
    layout = data["baseline"]["plan"]["layout"]
    label = layout_label(layout)
    again = search_json(capsys, *TIGHT, "--top", "3", "--baseline", label)
    assert again["baseline"]["plan"] == data["baseline"]["plan"]
    assert again["baseline"]["rank"] == data["baseline"]["rank"]
    stated = {k: layout[k] for k in ("tp", "pp", "vpp", "cp", "dp", "mbs", "zero")}
    if layout["offload_optimizer"]:
        stated["offload_optimizer"] = True  # the label's "off"
    assert again["baseline"]["stated"] == stated
    open_vpp = search_json(capsys, *TIGHT, "--top", "3", "--baseline", "tp2 pp2x?")
    assert open_vpp["baseline"] == data["baseline"]


def test_a_baseline_that_does_not_fit_is_reported_not_fatal(capsys) -> None:
    """The search still ranks; the baseline says why nothing with its degrees fits."""
    argv = ("--top", "2", "--baseline", "tp=1,pp=1,zero=0,recompute=none")
    data = search_json(capsys, *TIGHT, *argv)
    placed = data["baseline"]
    assert placed["plan"] is None and placed["rank"] is None and len(data["plans"]) == 2
    assert placed["miss"].startswith("no layout fits in 24.00 GiB")
    code, out, err = invoke(capsys, "search", *TIGHT, *argv)
    assert code == 0, err
    assert "baseline (tp=1 pp=1 zero=0 recompute=none): no layout with these degrees fits; " in out


@pytest.mark.parametrize(
    ("baseline", "says"),
    [
        ("tp=2,tensor=4", "--baseline: unknown degree 'tensor'"),
        ("tp=two", "--baseline: tp: 'two' is not a whole number"),
        ("tp=3", "--baseline: no layout of 8 devices matches"),
        ("ep=2", "--baseline: ep(2) but the model has no experts"),
        (
            "tp2 tensor4",
            "--baseline tp2 tensor4: no such file; give degrees as tp=4,pp=8,vpp=5, as",
        ),
        ("plans.json", "holds a search's plans"),
        (
            "split.json",
            "layers_per_stage: expected decoder layers per chunk, e.g. [20, 20, 21, 19]",
        ),
        ("batch.json", "num_microbatches(3) needs dp and mbs"),
    ],
)
def test_a_bad_baseline_is_invalid_input(capsys, tmp_path: Path, monkeypatch, baseline, says):
    monkeypatch.chdir(tmp_path)
    Path("plans.json").write_text('{"summary": {}, "plans": []}')
    Path("split.json").write_text('{"layout": {"tp": 1, "pp": 2, "layers_per_stage": "20,12"}}')
    Path("batch.json").write_text('{"tp": 1, "dp": 8, "mbs": 1, "num_microbatches": 3}')
    code, out, err = invoke(capsys, "search", *SMALL, "--baseline", baseline)
    assert code == 3 and says in one_error_line(err) and out == ""


def test_a_baseline_split_the_search_does_not_try_is_ranked_with_its_own_and_said(
    capsys, tmp_path: Path
) -> None:
    """A baseline stating its layers per chunk is placed with the search's own splits (even
    or balanced); where the stated one differs, a warning names the split ranked and the
    estimate command that prices the stated one."""
    split = tmp_path / "split.json"
    split.write_text('{"layout": {"tp": 1, "pp": 2, "layers_per_stage": [20, 12]}}')
    code, out, err = invoke(capsys, "search", *SMALL, "--baseline", str(split))
    assert code == 0, err
    assert "baseline (tp=1 pp=2 vpp=1): tp1 pp2 " in out  # one chunk per stage, as the split
    (line,) = [x for x in err.splitlines() if "layers per chunk" in x]
    assert line.startswith(
        f"warning: --baseline {split}: its layers per chunk (20,12) are not a split the search "
        "tries; ranked with the search's own (17,15); price yours with estimate --tp 1 --pp 2 "
    )  # the balanced split: the last stage lighter by the output layer
    assert line.endswith(" --layers-per-chunk 20,12")


def test_a_baseline_is_not_placed_among_rebalanced_plans(capsys, tmp_path: Path) -> None:
    """--rebalance re-ranks only the top K, so a baseline's exact rank and gap would be
    against plans no longer listed: the pair is refused before the search runs, with no
    output file; the library's rebalance refuses a result that places a baseline."""
    out = tmp_path / "ranking.csv"
    argv = ("--baseline", "tp=2", "--rebalance", "--ranking-csv", str(out))
    code, stdout_text, err = invoke(capsys, "search", *SMALL, *argv)
    assert code == 3 and stdout_text == "" and not out.exists()
    assert one_error_line(err).startswith("ndplan: error: --baseline: not with --rebalance (")
    planner = Planner()
    ctx = planner.context(
        planner.model("llama-3-8b"),
        planner.device("h100"),
        8,
        Job(global_batch_size=32, seq_length=4096),
    )
    outcome = planner.search(ctx, SearchSpace(recompute=("full",)), top_k=2, baseline={"tp": 2})
    with pytest.raises(BaselineError, match="not with rebalancing"):
        planner.rebalance(ctx, outcome.result)


def test_a_baseline_outside_the_space_and_faster_is_not_called_the_best(capsys) -> None:
    # --tp 8 fixes the space; the baseline's tp 1 lies outside it and beats all of it.
    code, out, err = invoke(capsys, "search", *SMALL, "--tp", "8", "--baseline", "tp=1")
    assert code == 0, err
    (line,) = (x for x in out.splitlines() if x.startswith("baseline (tp=1)"))
    assert "is faster than every layout searched" in line and "is the best plan" not in line
    assert "outside the search space; search with its values (tp=1)" in line


def test_a_baseline_outside_the_space_and_slower_says_so_beside_its_rank(capsys) -> None:
    # Its rank counts only the layouts searched (tp 2 here), so the line says what it is
    # outside of (pp is free: not named); inside the space the same layout has no remark.
    argv = ("search", *SMALL, "--baseline", "tp=8", "-t", "3")
    code, out, err = invoke(capsys, *argv, "--tp", "2")
    assert code == 0, err
    (line,) = (x for x in out.splitlines() if x.startswith("baseline (tp=8)"))
    assert "(outside the searched space: tp 8 where the search took 2) ranks " in line
    code, out, err = invoke(capsys, *argv)
    assert code == 0, err
    (line,) = (x for x in out.splitlines() if x.startswith("baseline (tp=8)"))
    assert "outside" not in line and " ranks " in line


@pytest.mark.parametrize("width", [80, 100])
def test_a_narrow_terminal_keeps_the_rankings_numbers_whole(capsys, monkeypatch, width) -> None:
    monkeypatch.setattr(output.stdout, "_width", width)
    code, out, err = invoke(capsys, "search", *SMALL, "-t", "3")
    assert code == 0, err
    lines = out.splitlines()
    top = lines.index(next(x for x in lines if x.startswith("┏")))
    ranking = lines[top : lines.index(next(x for x in lines[top:] if x.startswith("└"))) + 1]
    assert all(len(x) <= width for x in ranking)
    assert not any("…" in x for x in ranking), "\n".join(ranking)
    assert "left out at this width: time shares %" in out
    plans = search_json(capsys, *SMALL, "-t", "3")["plans"]
    for plan in plans:  # every step time is printed whole
        assert f"{plan['time']['step_s']:.3f}" in out


def test_a_plugins_cost_model_is_chosen_by_name_and_named_in_the_report(capsys) -> None:
    """A cost model registered beside the built-in one is used with --cost-model and the
    report says which priced it; `ndplan plugins` lists it; an unknown name is one line."""
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "64", "-s", "4096")
    layout = ("--tp", "4", "--pp", "1")
    steps = {}
    for cost in ("ndplan", "slow-tp"):
        code, out, err = invoke(
            capsys, "-p", "slow_tp_cost", "estimate", *argv, *layout, "--cost-model", cost, "--json"
        )
        assert code == 0, err
        steps[cost] = json.loads(out)["time"]["step_s"]
    assert steps["slow-tp"] > steps["ndplan"]
    code, out, err = invoke(
        capsys, "-p", "slow_tp_cost", "search", *argv, "-t", "2", "--cost-model", "slow-tp"
    )
    assert code == 0, err
    assert "· cost model 'slow-tp'" in out
    code, out, err = invoke(capsys, "-p", "slow_tp_cost", "plugins", "--json")
    assert next(p["registers"] for p in json.loads(out) if p["name"] == "slow_tp_cost") == {
        "cost model": ["slow-tp"]
    }
    code, out, err = invoke(capsys, "search", *argv, "--cost-model", "slow-tp")
    assert code == 3 and out == "" and "unknown cost model 'slow-tp'" in err
