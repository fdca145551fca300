"""Inputs ``ndplan search`` must refuse up front, in one line with exit 3 and nothing
written (issue 7; the project's rule for bad input): budgets that are not numbers or
exceed the device, output paths that cannot be written, a fixed schedule or expert
degree that cannot work, search-space files whose values are the wrong type, and a
plugin's refusal rule that raises (a plugin error, exit 4)."""

from __future__ import annotations

import csv
import json
import os
import threading
from pathlib import Path

import pytest

from ndplan.cli import output
from ndplan.cli.app import run
from ndplan.core.search import FIELDS

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
SMALL = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048", "-j", "1")
MOE = ("-m", "qwen3-30b-a3b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048", "-j", "1")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(output.stdout, "_width", 400)
    monkeypatch.syspath_prepend(str(PLUGINS))


def invoke(capsys, *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ndplan: error: "), err
    return lines[0]


def plans(out: str) -> list[dict]:
    return json.loads(out)["plans"]


# ----------------------------------------------------------------------------- budget


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("nan", "--max-mem: must be a positive number of GiB, got nan"),
        ("inf", "--max-mem: must be a positive number of GiB, got inf"),
        ("0", "--max-mem: must be a positive number of GiB, got 0.0"),
        ("200", "--max-mem: 200 GiB is more than the h100-sxm's 80 GiB; give at most 80"),
    ],
)
def test_a_memory_budget_that_is_not_a_usable_part_of_the_device_is_refused(
    capsys, value: str, says: str
) -> None:
    for argv in (("search", *SMALL), ("estimate", *SMALL[:10])):  # estimate has no -j
        code, out, err = invoke(capsys, *argv, "--max-mem", value)
        assert code == 3 and out == "" and says in error_line(err)


def test_a_budget_from_a_file_is_named_by_the_file(capsys, tmp_path: Path) -> None:
    """A space file's (or a sweep file's) max_mem is named where it was written, not as
    the --max-mem flag the user never gave; the flag, given too, overrides the file."""
    space = tmp_path / "space.yaml"
    space.write_text("max_mem: 200\n", encoding="utf-8")
    says = f"{space}: max_mem: 200 GiB is more than the h100-sxm's 80 GiB"
    for command in ("search", "sweep"):
        code, out, err = invoke(capsys, command, *SMALL, "--space", str(space))
        assert code == 3 and out == "" and says in error_line(err), command
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("max_mem: 200\nspace: {max_mem: 300}\n", encoding="utf-8")
    code, out, err = invoke(capsys, "sweep", str(sweep), *SMALL)
    assert code == 3 and f"{sweep}: max_mem: 200 GiB is more than" in error_line(err)
    code, out, err = invoke(capsys, "search", *SMALL, "--space", str(space), "--max-mem", "60")
    assert code == 0, err


def test_an_infinite_reserve_is_refused(capsys) -> None:
    code, out, err = invoke(capsys, "search", *SMALL, "--reserve", "inf")
    assert code == 3 and out == ""
    assert "--reserve: must be a finite number of GiB, got inf" in error_line(err)


@pytest.mark.parametrize("field", ["memory_gib: .inf", "memory_gib: .nan"])
def test_a_device_file_with_infinite_or_nan_memory_is_refused(
    capsys, tmp_path: Path, field: str
) -> None:
    device = tmp_path / "dev.yaml"
    device.write_text(
        "- id: lab-accel\n"
        f"  {field}\n"
        "  peak_tflops: {bf16: 500}\n"
        "  hbm_bandwidth_gb_per_s: 3000\n"
        "  scale_up: {domain_size: 8, bandwidth_gb_per_s: 400}\n"
        "  scale_out: {bandwidth_gb_per_s: 50}\n",
        encoding="utf-8",
    )
    argv = ("-m", "llama-3-8b", "-d", "lab-accel", "-n", "8", "--gbs", "16", "-s", "2048")
    code, out, err = invoke(capsys, "estimate", *argv, "--device-file", str(device))
    assert code == 3 and out == ""
    assert "memory_gib: Input should be a finite number" in error_line(err)


# ----------------------------------------------------------------------------- files out


def test_an_output_path_that_is_a_folder_is_refused_even_with_force(capsys, tmp_path: Path) -> None:
    code, out, err = invoke(capsys, "search", *SMALL, "--ranking-csv", str(tmp_path), "--force")
    assert code == 3 and out == ""
    assert f"--ranking-csv {tmp_path}: is a folder; give a file path" in error_line(err)


def test_a_symlinked_output_replaces_the_file_it_names_and_keeps_the_link(
    capsys, tmp_path: Path
) -> None:
    """Before, the rename replaced the link itself with a new file, and the file it named
    kept the old ranking: the user's link silently stopped meaning anything."""
    target = tmp_path / "runs" / "ranking.csv"
    target.parent.mkdir()
    target.write_text("old\n", encoding="utf-8")
    link = tmp_path / "ranking.csv"
    link.symlink_to(target)
    code, _, err = invoke(capsys, "search", *SMALL, "--ranking-csv", str(link), "--json")
    assert code == 3 and "pass --force" in error_line(err)
    assert target.read_text(encoding="utf-8") == "old\n"
    code, _, err = invoke(capsys, "search", *SMALL, "--ranking-csv", str(link), "--json", "--force")
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert target.read_text(encoding="utf-8").startswith("rank,")
    assert sorted(p.name for p in target.parent.iterdir()) == ["ranking.csv"]  # no temp file


def test_a_pipe_as_output_is_written_into_without_force(capsys, tmp_path: Path) -> None:
    """``--ranking-csv >(gzip > r.csv.gz)`` or ``/dev/stdout``: a stream is written into.
    Before, it needed --force, and then a file renamed over it replaced the pipe (as
    root, ``/dev/null`` itself) while the reader got nothing."""
    fifo = tmp_path / "ranking.fifo"
    os.mkfifo(fifo)
    # The reader is open before the command starts, so the command's open never waits
    # for one; it drains the pipe until the command has returned, so no write waits.
    read_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    finished = threading.Event()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk:
                chunks.append(chunk)
            elif finished.is_set():
                return
            else:
                finished.wait(0.01)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code, out, err = invoke(capsys, "search", *SMALL, "--ranking-csv", str(fifo), "--json")
    finally:
        finished.set()
        reader.join(timeout=30)
        os.close(read_end)
    received = [b"".join(chunks).decode("utf-8")]
    assert code == 0, err
    plans = json.loads(out)["plans"]
    rows = list(csv.DictReader(received[0].splitlines()))
    assert [r["rank"] for r in rows[: len(plans)]] == [str(p["rank"]) for p in plans]
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["ranking.fifo"]


def test_a_dash_is_not_a_ranking_csv_path(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke(capsys, "search", *SMALL, "--ranking-csv", "-")
    assert code == 3 and out == "" and not (tmp_path / "-").exists()
    assert "--ranking-csv -: give a file path" in error_line(err)


def test_an_output_path_under_a_file_is_refused_before_the_search(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before any pricing: the search itself must not run."""
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    searched = []
    from ndplan.planner import Planner

    real = Planner.search
    monkeypatch.setattr(Planner, "search", lambda *a, **k: searched.append(1) or real(*a, **k))
    for flag in ("--ranking-csv", "--debug-dir"):
        target = a_file / "sub" / "out.csv" if flag == "--ranking-csv" else a_file / "dbg"
        code, out, err = invoke(capsys, "search", *SMALL, flag, str(target))
        assert code == 3 and out == "" and not searched
        assert f"{a_file} is a file, not a folder" in error_line(err)
    assert a_file.read_text() == "mine"


# ----------------------------------------------------------------------------- fixed values


def test_a_schedule_the_framework_lacks_is_refused(capsys) -> None:
    code, out, err = invoke(capsys, "search", *SMALL, "--schedule", "gpipe")
    assert code == 3 and out == ""
    assert "schedule 'gpipe' is not offered by megatron" in error_line(err)


@pytest.mark.parametrize("schedule", ["interleaved", "dualpipev"])
def test_a_fixed_schedule_is_the_only_one_ranked(capsys, schedule: str) -> None:
    """A pipeline schedule asks for a pipeline: no pp 1 layout labelled 1f1b is ranked."""
    code, out, err = invoke(capsys, "search", *SMALL, "--schedule", schedule, "--json")
    assert code == 0, err
    ranked = plans(out)
    assert ranked
    assert {p["layout"]["schedule"] for p in ranked} == {schedule}
    assert all(p["layout"]["pp"] > 1 for p in ranked)


@pytest.mark.parametrize(
    ("argv", "reason"),
    [(("--ep", "3"), "ep_not_dividing_experts"), (("--etp", "3"), "ep_etp_not_dividing_group")],
)
def test_a_fixed_expert_degree_that_cannot_work_is_refused_by_name(
    capsys, argv: tuple[str, ...], reason: str
) -> None:
    """The rule that refuses it is counted, not a rule it never reached."""
    code, out, err = invoke(capsys, "search", *MOE, *argv)
    assert code == 3 and out == ""
    line = error_line(err)
    assert "every layout in the search space is refused" in line and reason in line


def test_a_fixed_ep_that_works_is_the_only_one_ranked(capsys) -> None:
    code, out, err = invoke(capsys, "search", *MOE, "--ep", "4", "--json")
    assert code == 0, err
    assert {p["layout"]["ep"] for p in plans(out)} == {4}


def test_a_fixed_etp_apart_from_tp_is_searched_as_estimate_prices_it(capsys) -> None:
    """Expert TP 2 under dense TP 1 or 4: searched, and each plan equals estimate's."""
    code, out, err = invoke(capsys, "search", *MOE, "--etp", "2", "--json")
    assert code == 0, err
    ranked = plans(out)
    assert {p["layout"]["etp"] for p in ranked} == {2}
    assert any(p["layout"]["tp"] != 2 for p in ranked)
    lay = ranked[0]["layout"]
    flags = [f"--{k}={lay[k]}" for k in ("tp", "pp", "cp", "ep", "etp", "mbs", "zero", "vpp")]
    flags += ["--sp" if lay["sp"] else "--no-sp", "--recompute", lay["recompute"]]
    flags += ["--schedule", lay["schedule"]]
    code, out, err = invoke(capsys, "estimate", *MOE[:10], *flags, "--json")
    assert code == 0, err
    assert json.loads(out)["time"]["step_s"] == ranked[0]["time"]["step_s"]


# ----------------------------------------------------------------------------- space files


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tp: true\n", "tp: True is not a whole number ≥ 1"),
        ("tp: []\n", "tp: an empty list allows nothing"),
        ("zero: [0, 5]\n", "zero: ZeRO stage 5 does not exist; use 0–3"),
        ("sp: 1\n", "sp: 1 is not true or false"),
        ("max_mem: .inf\n", "max_mem: must be a positive number of GiB, got inf"),
        ("reserve: -1\n", "reserve: must be a non-negative number of GiB, got -1"),
        ("max_tp: 0\n", "max_tp: must be a whole number ≥ 1, got 0"),
        ("balance_layers: 0\n", "balance_layers: must be true or false, got 0"),
        # Named choices name every choice, as the flags do (this read 'recompute.1: Input
        # should be ...', pydantic's path into the list).
        (
            "recompute: [full, bogus]\n",
            "recompute: 'bogus' unknown; use none, selective, full, auto or stated",
        ),
        ("schedule: [1f1b, 2]\n", "schedule: 2 unknown; use 1f1b, interleaved, gpipe or dualpipev"),
    ],
)
def test_space_file_values_of_the_wrong_type_are_refused(
    capsys, tmp_path: Path, text: str, says: str
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(text, encoding="utf-8")
    code, out, err = invoke(capsys, "search", *SMALL, "--space", str(space))
    assert code == 3 and out == "" and says in error_line(err)


def test_a_baseline_names_the_schedules_it_could_have(capsys) -> None:
    code, out, err = invoke(capsys, "search", *SMALL, "--baseline", "tp=2,schedule=bogus")
    assert code == 3 and out == ""
    assert error_line(err) == (
        "ndplan: error: --baseline: schedule: 'bogus' unknown; "
        "use 1f1b, interleaved, gpipe or dualpipev"
    )


def test_a_listed_zero_stage_the_framework_lacks_is_refused(capsys, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("zero: [2, 3]\n", encoding="utf-8")
    argv = (*SMALL, "--space", str(space), "--framework", "torchtitan")
    code, out, err = invoke(capsys, "search", *argv)
    assert code == 3 and out == ""
    assert "zero(2) is not offered by torchtitan (offers 0, 3)" in error_line(err)


def test_a_space_file_states_the_memory_budget_and_a_flag_overrides_it(
    capsys, tmp_path: Path
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("max_mem: 30\nreserve: 2\n", encoding="utf-8")
    code, out, err = invoke(capsys, "search", *SMALL, "--space", str(space), "--json")
    assert code == 0, err
    for plan in plans(out):
        assert plan["memory"]["capacity_bytes"] == 30 * 2**30
        assert plan["memory"]["peak_bytes"] <= 28 * 2**30
    code, out, err = invoke(
        capsys, "search", *SMALL, "--space", str(space), "--max-mem", "40", "--json"
    )
    assert code == 0, err
    assert {p["memory"]["capacity_bytes"] for p in plans(out)} == {40 * 2**30}


# ----------------------------------------------------------------------------- layer split

PIPELINED = ("-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "64", "-s", "8192")
PIPELINED += ("--pp", "16", "--tp", "1", "--vpp", "1", "--mbs", "1", "-j", "1")


def test_the_balanced_split_is_searched_marked_and_can_be_turned_off(
    capsys, tmp_path: Path
) -> None:
    """At pp 16 Llama 3 8B's output layer is about two layers of work (1.95 as the cost
    model prices it, so the last stage keeps one layer): the balanced split wins,
    the table marks it and --json states its layers; --even-layers (or the space file's
    balance_layers: false) searches even splits only."""
    code, out, err = invoke(capsys, "search", *PIPELINED, "--json", "-t", "3")
    assert code == 0, err
    best = plans(out)[0]
    assert best["layout"]["layers_per_stage"] == [2] * 14 + [3, 1]
    ranking = tmp_path / "ranking.csv"
    code, table, err = invoke(
        capsys, "search", *PIPELINED, "-t", "3", "--ranking-csv", str(ranking)
    )
    assert code == 0, err
    assert "16* " in table and "* decoder layers split unevenly" in table
    # The ranking states each uneven split's counts, as estimate --layers-per-chunk takes them.
    rows = list(csv.DictReader(ranking.open(encoding="utf-8")))
    assert rows[0]["split"] == "balanced" and rows[0]["layers_per_chunk"] == "2," * 14 + "3,1"
    # Each layout once, at its faster split (the even one of the best was priced, slower).
    layouts = [tuple(r[f] for f in FIELDS if f != "split") for r in rows]
    assert len(set(layouts)) == len(layouts)
    even_ranking = tmp_path / "even.csv"
    code, out, err = invoke(
        capsys, "search", *PIPELINED, "--json", "--even-layers", "--ranking-csv", str(even_ranking)
    )
    assert code == 0, err
    even_rows = list(csv.DictReader(even_ranking.open(encoding="utf-8")))
    assert {(r["split"], r["layers_per_chunk"]) for r in even_rows} == {("even", "")}
    even = plans(out)
    assert all(p["layout"]["layers_per_stage"] is None for p in even)
    assert even[0]["time"]["step_s"] > best["time"]["step_s"]
    space = tmp_path / "space.yaml"
    space.write_text("balance_layers: false\n", encoding="utf-8")
    code, out, err = invoke(capsys, "search", *PIPELINED, "--json", "--space", str(space))
    assert code == 0, err
    assert [p["layout"] for p in plans(out)] == [p["layout"] for p in even]


def test_a_default_split_with_a_remainder_is_marked_and_its_counts_stated(
    capsys, tmp_path: Path
) -> None:
    """32 layers over 3 stages is no even split (Megatron needs the layout spelled out): the
    table marks it like a balanced one, the ranking CSV states its counts, and --json's
    stages hold them; 4 stages divide the layers and are not marked."""
    argv = ("search", "-m", "llama-3-8b", "-d", "h100", "--gbs", "48", "-s", "4096", "--tp", "1")
    argv += ("--vpp", "1", "--mbs", "1", "--even-layers", "-t", "2", "-j", "1")
    ranking = tmp_path / "ranking.csv"
    code, table, err = invoke(capsys, *argv, "-n", "12", "--pp", "3", "--ranking-csv", str(ranking))
    assert code == 0, err
    assert "│ 3* │" in table and "* decoder layers split unevenly" in table
    rows = list(csv.DictReader(ranking.open(encoding="utf-8")))
    assert {(r["split"], r["layers_per_chunk"]) for r in rows} == {("even", "11,11,10")}
    code, out, err = invoke(capsys, *argv, "-n", "12", "--pp", "3", "--json")
    assert code == 0, err
    stages = plans(out)[0]["memory"]["stages"]
    assert [stop - start for s in stages for start, stop in s["layers"]] == [11, 11, 10]
    assert plans(out)[0]["layout"]["layers_per_stage"] is None
    code, table, err = invoke(capsys, *argv, "-n", "16", "--pp", "4")
    assert code == 0, err
    assert "4*" not in table and "unevenly" not in table


# ----------------------------------------------------------------------------- plugins


def test_a_plugins_refusal_rule_that_raises_is_a_plugin_error(capsys, tmp_path: Path) -> None:
    module = tmp_path / "raising_rule.py"
    module.write_text(
        "from ndplan.plugins.hookspecs import hookimpl\n"
        "def judge(layout, context):\n"
        "    if layout.tp == 2:\n"
        "        raise RuntimeError('no tp 2 here')\n"
        "@hookimpl\n"
        "def ndplan_register_refusal_rules(registry):\n"
        "    registry.add('raising_rule', judge)\n",
        encoding="utf-8",
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        code, out, err = invoke(capsys, "-p", "raising_rule", "search", *SMALL)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("raising_rule", None)
    assert code == 4 and out == ""
    line = error_line(err)
    assert "refusal rule 'raising_rule' on layout tp2" in line
    assert "plugin 'raising_rule' raised RuntimeError: no tp 2 here" in line


# ----------------------------------------------------------------------------- estimate


def test_estimate_refuses_what_the_search_refuses(capsys) -> None:
    """One layout priced by estimate obeys the rules the search counts as refusals."""
    code, out, err = invoke(capsys, "estimate", *MOE[:10], "--tp", "2", "--no-sp", "--ep", "4")
    assert code == 3 and out == ""
    assert "tp(2) with experts needs sequence parallelism in megatron" in error_line(err)
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "4100")
    code, out, err = invoke(capsys, "estimate", *argv, "--cp", "4")
    assert code == 3 and out == ""
    assert "cp(4) needs the sequence length(4100) divisible by 2·cp = 8" in error_line(err)


def test_mxfp8_needs_block_scaled_tensor_cores(capsys) -> None:
    for device, code_wanted in (("h100", 3), ("b200", 0)):
        argv = ("-m", "llama-3-8b", "-d", device, "-n", "8", "--gbs", "16", "-s", "2048")
        code, out, err = invoke(capsys, "estimate", *argv, "--precision", "mxfp8", "--json")
        assert code == code_wanted, err
    assert out != ""
    code, out, err = invoke(capsys, "search", *SMALL, "--precision", "mxfp8")
    assert code == 3 and out == ""
    assert "'mxfp8' needs MX block-scaled tensor cores, which h100-sxm" in error_line(err)


def test_a_sweep_budget_beyond_a_device_is_refused(capsys) -> None:
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "2048", "-j", "1")
    code, out, err = invoke(capsys, "sweep", *argv, "--max-mem", "81")
    assert code == 3 and out == ""
    assert "--max-mem: 81 GiB is more than the h100-sxm's 80 GiB" in error_line(err)


def test_a_search_where_nothing_fits_still_records_why(capsys, tmp_path: Path) -> None:
    """Exit 1 is an answer, not an abort: the debug folder gets every refusal, each
    over-memory candidate with its stage and overshoot."""
    debug = tmp_path / "debug"
    argv = ("-m", "llama-3.1-405b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "4096")
    code, out, err = invoke(capsys, "search", *argv, "-j", "1", "--debug-dir", str(debug))
    assert code == 1 and out == "" and "no layout fits" in error_line(err)
    reasons = [
        line.split(",", 1)[0]
        for line in (debug / "debug_refusals.csv").read_text().splitlines()[1:]
    ]
    over = [r for r in reasons if r.startswith("over_memory (stage ")]
    assert over and len(over) == len([r for r in reasons if r.startswith("over_memory")])
    # Nothing was priced: the parts files hold their header (the candidate's fields), not
    # an empty line a CSV reader cannot name columns from.
    for name in ("debug_mem.csv", "debug_perf.csv"):
        header = (debug / name).read_text().splitlines()
        assert len(header) == 1 and header[0].startswith("tp,pp,cp,dp,"), name


def test_tp_refused_by_max_tp_is_counted_under_that_bound(capsys) -> None:
    code, out, err = invoke(capsys, "search", *SMALL, "--max-tp", "2", "--json")
    assert code == 0, err
    refused = json.loads(out)["summary"]["refused"]
    assert refused["tp_above_max_tp"] == 2  # tp 4 and tp 8 of 8 devices
    assert "tp_beyond_scale_up_domain" not in refused


def test_quiet_drops_notes_then_warnings_but_never_errors(capsys) -> None:
    """-q drops the assumptions line, -qq the warnings too; the result and errors stay."""
    unfilled = ("--gbs", "4", "--pp", "8", "--tp", "1", "--json")
    argv = (*SMALL[:6], "-s", "4096", "-j", "1", *unfilled)
    code, out, err = invoke(capsys, "search", *argv)
    assert code == 0 and "assumed:" in err and "warning:" in err
    code, quiet_out, err = invoke(capsys, "-q", "search", *argv)
    assert code == 0 and "assumed:" not in err and "warning:" in err
    code, quieter_out, err = invoke(capsys, "-qq", "search", *argv)
    assert code == 0 and err == ""
    assert plans(quiet_out) == plans(quieter_out) == plans(out)
    code, _, err = invoke(capsys, "-qq", "search", *SMALL, "--max-mem", "nan")
    assert code == 3 and "--max-mem" in error_line(err)


def test_verbosity_flags_may_follow_the_command(capsys) -> None:
    """``ndplan search … -q`` as users type it reads as ``ndplan -q search …``; a -q that
    is an option's value, or follows ``--``, is left to the command."""
    argv = (*SMALL, "--json")
    code, out, err = invoke(capsys, "search", *argv, "-q")
    assert code == 0 and "assumed:" not in err
    _, before, before_err = invoke(capsys, "-q", "search", *argv)
    assert plans(out) == plans(before) and err == before_err
    code, _, err = invoke(capsys, "search", *argv, "-v", "-qq")  # -v and -qq: net -q
    assert code == 0 and "assumed:" not in err
    code, _, err = invoke(capsys, "search", *argv, "--space", "-q")
    assert code == 3 and "-q: cannot read the search-space file" in error_line(err)
    code, _, err = invoke(capsys, "search", *argv, "--", "-q")
    assert code == 2 and "-q" in err


def test_v_names_the_executor_and_vv_prints_each_priced_candidate(capsys) -> None:
    argv = (*SMALL[:-2], "--json", "-j", "2")
    code, _, err = invoke(capsys, "-v", "search", *argv)
    assert code == 0 and "pricing: the pool executor, 2 workers" in err
    assert "priced " not in err
    code, out, err = invoke(capsys, "-vv", "search", *argv)
    assert code == 0 and "pricing: the serial executor, in this process (-vv" in err
    result = json.loads(out)
    lines = [line for line in err.splitlines() if line.startswith("priced ")]
    assert len(lines) == result["summary"]["priced"] > 0
    best = result["plans"][0]
    layout = best["layout"]
    # The best plan's own line: its degrees, its peak and its step time.
    mine = [
        line
        for line in lines
        if f"tp={layout['tp']} pp={layout['pp']} " in line
        and f" mbs={layout['mbs']} num_microbatches={layout['num_microbatches']} " in line
        and f" zero={layout['zero']} " in line
        and f"step {best['time']['step_s']:.4f} s" in line
    ]
    assert mine, lines
    assert (
        f"peak {best['memory']['peak_bytes'] / 2**30:.2f} GiB (stage {best['memory']['peak_stage']})"
        in mine[0]
    )
    # Same ranking as without the lines.
    _, quiet_out, _ = invoke(capsys, "search", *argv)
    assert plans(out) == plans(quiet_out)


def test_more_workers_than_cores_is_honoured_with_a_warning(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ndplan.cli import executors

    monkeypatch.setattr(executors.os, "cpu_count", lambda: 1)
    argv = (*SMALL[:-2], "--json")
    code, out, err = invoke(capsys, "search", *argv, "-j", "2")
    assert code == 0, err
    assert "warning: -j 2 starts more workers than this machine's 1 logical cores" in err
    code, serial, err = invoke(capsys, "search", *argv, "-j", "1")
    assert code == 0 and "more workers" not in err
    assert plans(out) == plans(serial)


def test_with_the_builtin_plugin_disabled_no_executor_is_a_plugin_error(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NDPLAN_DISABLE_PLUGINS", "ndplan.builtin")
    code, out, err = invoke(capsys, "search", *SMALL)
    assert code == 4 and out == ""
    assert "no executor to price with (serial: not registered)" in error_line(err)


def test_sp_at_tp_1_is_priced_without_it_and_says_so(capsys) -> None:
    for argv in (("search", *SMALL, "--json"), ("estimate", *SMALL[:10], "--json")):
        code, out, err = invoke(capsys, *argv, "--sp", "--tp", "1")
        assert code == 0, err
        assert "warning: --sp has no effect at tp 1" in err
        layouts = (
            [p["layout"] for p in plans(out)]
            if argv[0] == "search"
            else [json.loads(out)["layout"]]
        )
        assert all(not lay["sp"] and lay["tp"] == 1 for lay in layouts)
    code, _, err = invoke(capsys, "search", *SMALL, "--sp", "--json")  # tp free: no warning
    assert code == 0 and "--sp has no effect" not in err


SIXTEEN = ("-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "32", "-s", "4096", "-j", "1")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--mbs", "3"), "mbs 3 fits no layout of 16 devices: dp·mbs must divide the global"),
        # 32 layers and the embedding and the loss: 14, 28 or 56 chunks of vpp 7 leave
        # more slots short than stages at every pp (vpp 3 runs as pp 4: 12 chunks of 3, two short)
        (("--vpp", "7"), "vpp 7 fits no layout of 16 devices: pp·vpp chunks must split the 32"),
        (("--schedule", "dualpipev", "--pp", "1"), "schedule dualpipev fits no layout"),
        (("--schedule", "interleaved", "--vpp", "1"), "'interleaved' needs vpp ≥ 2"),
        # 2 chunks of 16 layers would split the 32: it is the lack of stages that stops it
        (
            ("--vpp", "2", "--pp", "1"),
            "vpp 2 fits no layout of 16 devices: interleaving needs pp > 1",
        ),
    ],
)
def test_a_fixed_value_no_layout_can_take_is_named(capsys, argv, says) -> None:
    """Not blamed on a rule that refused something else (tp 16 beyond the scale-up domain)."""
    code, out, err = invoke(capsys, "search", *SIXTEEN, *argv)
    assert code == 3 and out == ""
    line = error_line(err)
    assert says in line and "tp_beyond_scale_up_domain" not in line


def test_all_to_all_cp_gives_each_rank_whole_heads(capsys, tmp_path: Path) -> None:
    """Ulysses splits the heads over tp·cp: Llama-3-8B's 32 heads (8 KV) allow 32 at most."""
    job = tmp_path / "job.yaml"
    job.write_text("cp_kind: all_to_all\n", encoding="utf-8")
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "64", "--gbs", "8", "-s", "131072")
    code, out, err = invoke(capsys, "search", *argv, "-j", "1", "--job", str(job), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["refused"]["cp_all_to_all_exceeds_heads"] > 0
    for plan in doc["plans"]:
        assert 32 % (plan["layout"]["tp"] * plan["layout"]["cp"]) == 0
    code, out, err = invoke(capsys, "estimate", *argv, "--job", str(job), "--cp", "64")
    assert code == 3 and out == ""
    assert "tp(1)·cp(64) = 64 does not split the 32 query / 8 key-value heads" in error_line(err)
    ring = ("estimate", *argv, "--cp", "64", "--json")  # the ring passes K/V blocks instead
    code, _, err = invoke(capsys, *ring)
    assert code == 0, err


def test_selective_recompute_where_the_framework_has_none_is_refused(capsys) -> None:
    """DeepSpeed checkpoints whole layers: 'selective' had priced as no recompute at all."""
    for argv in (("search", *SIXTEEN), ("estimate", *SIXTEEN[:10])):
        code, out, err = invoke(
            capsys, *argv, "--framework", "deepspeed", "--recompute", "selective"
        )
        assert code == 3 and out == ""
        assert "recompute 'selective' is not offered by deepspeed" in error_line(err)


DEVICE = (
    "- id: {id}\n"
    "  memory_gib: 96\n"
    "  memory_reserve_gib: {reserve}\n"
    "  peak_tflops: {{bf16: 800}}\n"
    "  hbm_bandwidth_gb_per_s: 4000\n"
    "  scale_up: {{domain_size: 8, bandwidth_gb_per_s: 450}}\n"
    "  scale_out: {{bandwidth_gb_per_s: 50}}\n"
    "  host_link: {{bandwidth_gb_per_s: 64}}\n"
)


def test_a_device_file_alias_that_names_a_catalog_device_is_refused(capsys, tmp_path: Path) -> None:
    device = tmp_path / "dev.yaml"
    device.write_text(DEVICE.format(id="lab-accel", reserve=4) + "  aliases: [h100]\n")
    code, out, err = invoke(capsys, "estimate", *SMALL[:10], "--device-file", str(device))
    assert code == 3 and out == ""
    assert "device alias 'h100' is claimed by 'h100-sxm' ('ndplan.builtin')" in error_line(err)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (DEVICE.format(id="''", reserve=4), "id: String should have at least 1 character"),
        (DEVICE.format(id="lab", reserve=100), "memory_reserve_gib (100) leaves nothing"),
        (DEVICE.format(id="lab", reserve=4) * 2, "device 'lab' is listed twice; keep one"),
    ],
)
def test_device_file_entries_that_cannot_be_meant_are_refused(
    capsys, tmp_path: Path, text: str, says: str
) -> None:
    device = tmp_path / "dev.yaml"
    device.write_text(text, encoding="utf-8")
    code, out, err = invoke(capsys, "devices", "--device-file", str(device))
    assert code == 3 and out == "" and says in error_line(err)
    device.write_text(DEVICE.format(id="lab", reserve=4), encoding="utf-8")
    code, out, err = invoke(capsys, "devices", "--device-file", str(device))
    assert code == 0 and "lab" in out, err


def test_deepspeed_runs_pipeline_stages_with_zero_1_at_most(capsys) -> None:
    argv = (*SIXTEEN[:10], "--framework", "deepspeed")
    code, out, err = invoke(capsys, "estimate", *argv, "--zero", "3", "--pp", "2")
    assert code == 3 and out == ""
    assert "zero(3) with pp(2): deepspeed runs pipeline stages with ZeRO 1 at most" in (
        error_line(err)
    )
    code, out, err = invoke(capsys, "search", *argv, "-j", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["refused"]["zero_not_with_pipeline"] > 0
    assert all(p["layout"]["zero"] <= 1 for p in doc["plans"] if p["layout"]["pp"] > 1)


def test_torchtitan_runs_context_parallelism_under_fsdp_only(capsys) -> None:
    """torchtitan enables FSDP over the data-parallel and CP ranks whenever cp > 1, so a
    CP layout without ZeRO-3 is not one it runs (it was ranked, and its exported config
    read back as another layout)."""
    argv = (*SIXTEEN[:10], "--framework", "torchtitan")
    code, out, err = invoke(capsys, "estimate", *argv, "--zero", "0", "--cp", "2")
    assert code == 3 and out == ""
    assert (
        "zero(0) with cp(2): torchtitan shards the parameters over the data-parallel and "
        "context-parallel ranks (FSDP) whenever cp > 1; use --zero 3 or --cp 1" in error_line(err)
    )
    code, out, err = invoke(capsys, "search", *argv, "-j", "1", "--json", "-t", "20")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["refused"]["cp_needs_fsdp"] > 0
    assert any(p["layout"]["cp"] > 1 for p in doc["plans"])
    assert all(p["layout"]["zero"] == 3 for p in doc["plans"] if p["layout"]["cp"] > 1)


def test_deepspeed_runs_no_sequence_parallelism_beside_context_parallelism(capsys) -> None:
    """Megatron-DeepSpeed's --ds-sequence-parallel-size (its CP) cannot be combined with
    its --sequence-parallel: such layouts are refused, and priced only without SP."""
    argv = (*SIXTEEN[:10], "--framework", "deepspeed")
    code, out, err = invoke(capsys, "estimate", *argv, "--tp", "2", "--cp", "2", "--sp")
    assert code == 3 and out == ""
    assert "sp with cp(2): deepspeed does not run sequence parallelism beside context" in (
        error_line(err)
    )
    code, out, err = invoke(capsys, "estimate", *argv, "--tp", "2", "--cp", "2", "--no-sp")
    assert code == 0, err
    code, out, err = invoke(capsys, "search", *argv, "--cp", "2", "-j", "1", "--json", "-t", "20")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["refused"]["sp_not_with_cp"] > 0
    assert not any(p["layout"]["sp"] and p["layout"]["tp"] > 1 for p in doc["plans"])


def test_a_listed_vpp_runs_one_slot_short_and_the_best_plan_says_how_to_place_it(
    capsys,
) -> None:
    """32 layers with the embedding and the loss are 34 slots: pp 4 × vpp 3 runs as 12
    chunks of 3, two of them short (or as the balanced split beside it). The best plan's
    report gives its layers per chunk and the Megatron flag that places them so."""
    code, out, err = invoke(capsys, "search", *SIXTEEN, "--vpp", "3", "--pp", "4", "-t", "1")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("layers per chunk: "))
    counts = []
    for part in line.removeprefix("layers per chunk: ").split(", "):
        n, _, times = part.partition(" ×")
        counts += [int(n)] * int(times or 1)
    assert len(counts) == 12 and sum(counts) == 32
    flag = next(x for x in out.splitlines() if x.startswith("megatron: "))
    chunks = flag.split('"')[1].split("|")
    assert [c.count("t") for c in chunks] == counts
    assert chunks[0].startswith("E") and chunks[-1].endswith("L")
    code, out, err = invoke(
        capsys, "search", *SIXTEEN, "--vpp", "3", "--pp", "4", "-t", "1", "--json"
    )
    assert code == 0, err
    assert plans(out)[0]["layout"]["layers_per_stage"] == counts


def test_a_torchtitan_baseline_without_a_global_batch_is_checked_against_the_devices(
    capsys, tmp_path: Path
) -> None:
    """torchtitan steps local_batch_size × the data-parallel degree when global_batch_size
    is unset; the search hands the reader its device count, so a file with FSDP over the
    rest (-1) is refused in one line naming that batch."""
    toml = tmp_path / "llama3_70b.toml"
    toml.write_text(
        "[training]\nlocal_batch_size = 8\nseq_len = 8192\n"
        "[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 8\n",
        encoding="utf-8",
    )
    argv = ("-m", "llama-3-70b", "-d", "h100", "-n", "64", "-s", "8192", "-t", "1", "-j", "1",
            "--framework", "torchtitan", "--baseline", str(toml))  # fmt: skip
    code, out, err = invoke(capsys, "search", *argv, "--gbs", "512")
    assert code == 3 and out == ""
    assert "local_batch_size 8 × data-parallel degree 8 = 64 sequences, not the search's " in (
        error_line(err)
    )
    assert len(err.strip().splitlines()) == 1
    code, out, err = invoke(capsys, "search", *argv, "--gbs", "64", "--json")
    assert code == 0, err
    assert json.loads(out)["baseline"]["plan"]["layout"]["tp"] == 8


BRIDGE = """\
model:
  _target_: megatron.bridge.models.llama.Llama3ModelProvider8B
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  virtual_pipeline_model_parallel_size: 2
  sequence_parallel: true
  num_layers: 32
  seq_length: 2048
train:
  global_batch_size: 16
  micro_batch_size: 1
optimizer:
  use_distributed_optimizer: true
ddp:
  use_distributed_optimizer: false
dataset:
  sequence_length: 2048
"""
NEMO = """\
name: megatron_gpt
trainer:
  devices: 8
model:
  micro_batch_size: 2
  global_batch_size: 16
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 1
  virtual_pipeline_model_parallel_size: null
  encoder_seq_length: 2048
  activations_checkpoint_granularity: full
  optim:
    name: distributed_fused_adam
"""


@pytest.mark.parametrize(
    ("text", "layout"),
    [
        (BRIDGE, {"tp": 2, "pp": 2, "vpp": 2, "mbs": 1, "sp": True, "zero": 1}),
        (NEMO, {"tp": 4, "pp": 1, "mbs": 2, "zero": 1, "recompute": "full"}),
    ],
)
def test_a_nested_megatron_bridge_or_nemo_yaml_baseline_is_read(
    capsys, tmp_path: Path, text: str, layout: dict
) -> None:
    """Megatron-Bridge's ConfigContainer YAML and NeMo 1.0's keep Megatron's arguments
    under model: / train: (NeMo by some names of its own); read flat, as the args file. A
    dump carries each section's every field, so a switch set in one is set (the
    distributed optimizer in optimizer:, left at false in ddp:)."""
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    code, out, err = invoke(capsys, "search", *SMALL, "-t", "1", "--json", "--baseline", str(path))
    assert code == 0, err
    placed = json.loads(out)["baseline"]["plan"]["layout"]
    assert {key: placed[key] for key in layout} == layout


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "trainer:\n  devices: 8\nmodel:\n  hidden_size: 4096\n",
            "trainer: a nested section, not a degree (got trainer.devices, …); ndplan reads "
            "nested Megatron-Bridge and NeMo YAML by model.tensor_model_parallel_size and the "
            "like, else give --baseline tp=…,pp=… or a flat Megatron args file",
        ),
        (
            BRIDGE.replace("  sequence_length: 2048", "  sequence_length: 4096"),
            "dataset.sequence_length: 4096 differs from model.seq_length 2048; make them agree",
        ),
    ],
)
def test_a_nested_yaml_baseline_ndplan_cannot_read_is_one_line(
    capsys, tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    code, out, err = invoke(capsys, "search", *SMALL, "-t", "1", "--baseline", str(path))
    assert code == 3 and out == ""
    assert says in error_line(err)


def test_a_torchtitan_baseline_runs_the_stages_its_layers_per_stage_make(
    capsys, tmp_path: Path
) -> None:
    """pipeline_parallel_layers_per_stage sets torchtitan's stages per rank: the layout it
    runs is placed, not one the search chooses."""
    toml = tmp_path / "llama3_8b.toml"
    toml.write_text(
        "[parallelism]\npipeline_parallel_degree = 2\ntensor_parallel_degree = 2\n"
        'pipeline_parallel_schedule = "Interleaved1F1B"\npipeline_parallel_layers_per_stage = 8\n'
        "pipeline_parallel_first_stage_less_layers = 0\n"
        "pipeline_parallel_last_stage_less_layers = 0\n",
        encoding="utf-8",
    )
    argv = (*SMALL, "-t", "1", "--framework", "torchtitan", "--baseline", str(toml))
    code, out, err = invoke(capsys, "search", *argv, "--json")
    assert code == 0, err
    placed = json.loads(out)["baseline"]["plan"]["layout"]
    assert (placed["pp"], placed["vpp"], placed["mbs"]) == (2, 2, 1)
    assert "the search chooses VPP" not in err
