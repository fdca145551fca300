"""``ndplan estimate`` (issue 4): one layout's memory per stage, whether it fits, its time.

- ``--memory-mode megatron --json`` reproduces Megatron-LM's estimate for every row of
  ``megatron_reference_vectors.csv`` (a config.json per row with the row's shapes);
- bad input is exit 3 with one line on stderr and no traceback; malformed flags stay
  click's exit 2;
- ``--json`` prints one plan with its layout, memory per stage (parts by name), time
  parts and rates; the human output prints memory per stage and whether it fits;
- ``--recompute auto`` prints per-stage layer ranges and finds a plan that fits where
  no recompute does not.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from megatron_reference import ROWS, row_config

from ndplan.cli import output
from ndplan.cli.app import run
from ndplan.core.errors import ExitCode

# = tests/conftest.py::SHARED_DATA
SHARED_DATA = Path(__file__).resolve().parents[1] / "data" / "shared"
MIB = 2**20
LLAMA_8B = ("-m", "llama-3.1-8b", "-d", "h100-sxm")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(output.stdout, "_width", 200)  # tables at 200 columns


def invoke(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(["estimate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def estimate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = invoke(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)  # exactly one JSON document on stdout


QWEN3_EP16 = ("-m", "qwen3-30b-a3b", "-d", "h100-sxm", "-n", "16", "--gbs", "64", "-s", "4096")
QWEN3_EP16 += ("--ep", "16")
"""Qwen3-30B-A3B at EP 16 over two H100 nodes: expert traffic crosses the network."""


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("ndplan: error: ")
    assert "Traceback" not in err
    return lines[0]


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of an invalid-input refusal (exit 3, nothing on stdout)."""
    code, out, err = invoke(capsys, *argv)
    assert code == ExitCode.INVALID_INPUT and out == ""
    return one_error_line(err)


# ----------------------------------------------------------------------------- megatron mode


def write_config(path: Path, r: dict[str, str]) -> Path:
    cfg = row_config(r)
    out = path / "config.json"
    out.write_text(json.dumps(cfg), encoding="utf-8")
    return out


def row_flags(r: dict[str, str]) -> list[str]:
    tp, pp, dp, mbs = int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["micro_batch"])
    flags = [
        "-d", "h100-sxm",
        "-n", str(tp * pp * dp),
        "--gbs", str(dp * mbs * int(r["num_microbatches"])),
        "-s", r["seq_len"],
        "--tp", str(tp),
        "--pp", str(pp),
        "--ep", r["ep"],
        "--mbs", str(mbs),
        "--zero", "1" if r["distributed_optimizer"] == "true" else "0",
        "--sp" if r["sequence_parallel"] == "true" else "--no-sp",
        "--recompute", r["recompute"],
        "--memory-mode", "megatron",
    ]  # fmt: skip
    if r["vpp"]:
        flags += ["--vpp", r["vpp"], "--schedule", "interleaved"]
    return flags


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_megatron_mode_reproduces_the_reference_vectors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, row: dict[str, str]
) -> None:
    config = write_config(tmp_path, row)
    plan = estimate_json(capsys, "-m", str(config), *row_flags(row))
    mem = plan["memory"]
    assert mem["mode"] == "megatron"
    assert mem["weights_and_optimizer_bytes"] / MIB == pytest.approx(
        float(row["weight_and_optimizer_MiB_head"]), abs=0.01
    )
    column = {"sp": "activation_MiB_sp_formula", "nosp": "activation_MiB_nosp_formula"}
    assert mem["activation_bytes"] / MIB == pytest.approx(
        float(row[column[row["formula_used"]]]), abs=0.01
    )
    assert plan["layout"]["vpp"] == (int(row["vpp"]) if row["vpp"] else 1)
    assert plan["layout"]["sp"] == (row["sequence_parallel"] == "true")


# ----------------------------------------------------------------------------- bad input


def test_unknown_device_suggests_near_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(capsys, "-m", "llama-3.1-8b", "-d", "h100-sx", "-n", "8", "--gbs", "8",
                            "-s", "4096")  # fmt: skip
    assert code == ExitCode.INVALID_INPUT
    line = one_error_line(err)
    assert "h100-sx" in line and "did you mean" in line and "h100-sxm" in line
    assert out == ""


def test_degrees_not_multiplying_to_the_devices_print_the_arithmetic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = invoke(capsys, *LLAMA_8B, "-n", "8", "--gbs", "6", "-s", "4096", "--tp", "2",
                          "--dp", "3")  # fmt: skip
    assert code == ExitCode.INVALID_INPUT
    assert "tp(2)·pp(1)·cp(1)·dp(3) = 6 ≠ devices(8)" in one_error_line(err)

    code, _, err = invoke(capsys, *LLAMA_8B, "-n", "8", "--gbs", "8", "-s", "4096", "--tp", "3")
    assert code == ExitCode.INVALID_INPUT
    assert "tp(3)·pp(1)·cp(1) = 3 does not divide devices(8)" in one_error_line(err)


def test_tp_not_dividing_the_heads(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = invoke(capsys, *LLAMA_8B, "-n", "6", "--gbs", "2", "-s", "4096", "--tp", "3")
    assert code == ExitCode.INVALID_INPUT
    assert "tp(3) does not divide the attention heads(32)" in one_error_line(err)


@pytest.mark.parametrize("value", ["-5", "0", "-0.5"])
def test_non_positive_max_mem(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, out, err = invoke(capsys, *LLAMA_8B, "-n", "8", "--gbs", "8", "-s", "4096",
                            "--max-mem", value)  # fmt: skip
    assert code == ExitCode.INVALID_INPUT
    assert "--max-mem" in one_error_line(err)
    assert out == ""


@pytest.mark.parametrize(
    "flags",
    [
        ("--tp", "abc"),
        ("--tp", "0"),
        ("--bogus",),
        ("--zero", "7"),
        ("--max-mem", "lots"),
    ],
    ids=["tp-not-int", "tp-zero", "unknown-flag", "zero-out-of-range", "max-mem-not-number"],
)
def test_malformed_flags_stay_clicks_exit_2(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]
) -> None:
    code, _, err = invoke(capsys, *LLAMA_8B, "-n", "8", "--gbs", "8", "-s", "4096", *flags)
    assert code == ExitCode.USAGE
    assert "Traceback" not in err


def test_a_missing_required_flag_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = invoke(capsys, *LLAMA_8B, "-n", "8", "-s", "4096")
    assert code == ExitCode.USAGE
    assert "--gbs" in err


def test_the_installed_entry_point_gives_exit_3_and_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from ndplan.cli.app import main; main()", "estimate",
         *LLAMA_8B, "-n", "8", "--gbs", "8", "-s", "4096", "--max-mem", "-5"],
        capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == ExitCode.INVALID_INPUT
    assert proc.stdout == ""
    one_error_line(proc.stderr)


# ----------------------------------------------------------------------------- output

LAYOUT_KEYS = {
    "dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "num_microbatches", "zero", "sp",
    "schedule", "recompute", "offload_optimizer",
}  # fmt: skip


def test_json_prints_one_plan_with_the_documented_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = estimate_json(capsys, *LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096",
                         "--tp", "2", "--pp", "2", "--recompute", "selective")  # fmt: skip
    assert set(plan["layout"]) >= LAYOUT_KEYS
    lay = plan["layout"]
    assert (lay["dp"], lay["tp"], lay["pp"], lay["num_microbatches"]) == (4, 2, 2, 8)
    assert lay["zero"] == 1 and lay["sp"] is True  # megatron's defaults, recorded as assumed
    mem = plan["memory"]
    assert isinstance(mem["peak_bytes"], int) and isinstance(mem["fits"], bool)
    assert len(mem["stages"]) == 2
    for stage in mem["stages"]:
        assert isinstance(stage["total_bytes"], int)
        parts = stage["parts"]
        assert {"activations", "weights", "gradients", "optimizer", "reserve"} <= set(parts)
        assert all(isinstance(k, str) and isinstance(v, int) for k, v in parts.items())
        assert stage["total_bytes"] == sum(parts.values())
    assert mem["peak_bytes"] == max(s["total_bytes"] for s in mem["stages"])
    assert "embedding_activations" in mem["stages"][0]["parts"]
    assert "loss_activations" in mem["stages"][1]["parts"]
    time = plan["time"]
    assert time["step_s"] > 0
    assert time["parts"] and all(isinstance(v, float) for v in time["parts"].values())
    assert sum(time["parts"].values()) == pytest.approx(time["step_s"])
    for key in ("tokens_per_s_per_device", "mfu", "hfu"):
        assert isinstance(plan[key], float) and plan[key] > 0
    assert plan["hfu"] >= plan["mfu"]


def test_no_tp_comm_overlap_exposes_the_tp_collectives(capsys: pytest.CaptureFixture[str]) -> None:
    args = (*LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096", "--tp", "4")
    default = estimate_json(capsys, *args)
    stated = estimate_json(capsys, *args, "--tp-comm-overlap")
    off = estimate_json(capsys, *args, "--no-tp-comm-overlap")
    assert stated["time"] == default["time"]  # on unless stated otherwise
    assert off["time"]["parts"]["tp_comm"] > default["time"]["parts"]["tp_comm"] > 0
    assert off["time"]["parts"]["forward"] == default["time"]["parts"]["forward"]


def test_deepep_dispatch_sends_fewer_tokens_across_nodes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Qwen3-30B-A3B at EP 16 over two H100 nodes: DeepEP crosses the network once per
    token and node where the all-to-all sends a copy per remote expert (about 4 of its 8),
    so the EP communication shrinks ~4× and nothing else moves; an unknown dispatcher, or
    DeepEP in a framework without it, is refused naming the flag, as is the --job key."""
    args = QWEN3_EP16
    default = estimate_json(capsys, *args)
    deepep = estimate_json(capsys, *args, "--moe-dispatcher", "deepep")
    assert default == estimate_json(capsys, *args, "--moe-dispatcher", "alltoall")
    ep, ep_deepep = default["time"]["parts"]["ep_comm"], deepep["time"]["parts"]["ep_comm"]
    assert 3.5 < ep / ep_deepep < 4.5
    for part in ("forward", "backward", "dp_comm"):
        assert deepep["time"]["parts"][part] == default["time"]["parts"][part]
    assert deepep["memory"] == default["memory"]
    line = refusal(capsys, *args, "--moe-dispatcher", "flex")
    assert line.startswith("ndplan: error: --moe-dispatcher: ")
    job = tmp_path / "job.yaml"
    job.write_text("moe_dispatcher: deepep\n", encoding="utf-8")
    line = refusal(capsys, *args, "--framework", "deepspeed", "--job", str(job))
    assert line.startswith(f"ndplan: error: {job}: moe_dispatcher: deepspeed has no DeepEP")


def test_the_a2a_overlap_hides_ep_traffic_and_is_refused_where_it_does_not_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--moe-a2a-overlap (Megatron's combined 1F1B schedule) lowers the EP communication
    of a one-stage EP layout and moves nothing else; torchtitan has no such schedule, so
    asking for it there, by flag or --job key, is one line naming where it was asked."""
    args = QWEN3_EP16
    default = estimate_json(capsys, *args)
    overlapped = estimate_json(capsys, *args, "--moe-a2a-overlap")
    assert default == estimate_json(capsys, *args, "--no-moe-a2a-overlap")
    parts, hidden = default["time"]["parts"], overlapped["time"]["parts"]
    assert 0 < hidden["ep_comm"] < parts["ep_comm"]
    for part in ("forward", "backward", "dp_comm"):
        assert hidden[part] == parts[part]
    line = refusal(capsys, *args, "--framework", "torchtitan", "--moe-a2a-overlap")
    assert line.startswith("ndplan: error: --moe-a2a-overlap: torchtitan does not")
    job = tmp_path / "job.yaml"
    job.write_text("moe_a2a_overlap: true\n", encoding="utf-8")
    line = refusal(capsys, *args, "--framework", "torchtitan", "--job", str(job))
    assert line.startswith(f"ndplan: error: {job}: moe_a2a_overlap: torchtitan")


def test_the_fused_grouped_mlp_speeds_up_the_experts_on_blackwell_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--moe-fused-grouped-mlp (Transformer Engine's fused grouped MLP) shortens the
    routed experts' compute and moves no memory or communication; it exists only for
    quantised experts on Blackwell and only in Megatron, and asking for it elsewhere is
    one line that says so."""
    args = ("-m", "qwen3-30b-a3b", "-d", "b200", "-n", "8", "--gbs", "64", "-s", "4096")
    args += ("--ep", "8", "--precision", "mxfp8")
    default = estimate_json(capsys, *args)
    assert default == estimate_json(capsys, *args, "--no-moe-fused-grouped-mlp")
    fused = estimate_json(capsys, *args, "--moe-fused-grouped-mlp")
    parts, faster = default["time"]["parts"], fused["time"]["parts"]
    assert faster["forward"] < parts["forward"] and faster["backward"] < parts["backward"]
    for part in ("ep_comm", "dp_comm", "optimizer"):
        assert faster[part] == parts[part]
    assert fused["memory"] == default["memory"]
    hopper = ("-m", "qwen3-30b-a3b", "-d", "h100-sxm", "-n", "8", "--gbs", "64", "-s", "4096")
    line = refusal(capsys, *hopper, "--ep", "8", "--precision", "fp8", "--moe-fused-grouped-mlp")
    assert line == (
        "ndplan: error: moe_fused_grouped_mlp (Transformer Engine's CuTe DSL kernel) needs a "
        "Blackwell device and an fp8, MXFP8 or fp4 recipe, not h100-sxm in fp8; drop "
        "--moe-fused-grouped-mlp"
    )
    line = refusal(capsys, *args[:-2], "--moe-fused-grouped-mlp")
    assert "not b200 in bf16" in line
    amd = ("-m", "qwen3-30b-a3b", "-d", "mi355x", "-n", "8", "--gbs", "64", "-s", "4096")
    line = refusal(capsys, *amd, "--precision", "mxfp8", "--moe-fused-grouped-mlp")
    assert "not mi355x in mxfp8" in line  # fp4 tensor cores, but not NVIDIA's
    line = refusal(capsys, *args, "--framework", "torchtitan", "--moe-fused-grouped-mlp")
    assert line.startswith("ndplan: error: --moe-fused-grouped-mlp: torchtitan does not")


def test_fp8_parameters_drop_the_bf16_weights_unless_turned_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = (*LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096", "--precision", "fp8")
    code, out, err = invoke(capsys, *args, "--json")
    assert code == 0, err
    assert "job.fp8_param_gather=True" in err  # an assumption, said so
    default = json.loads(out)
    off = estimate_json(capsys, *args, "--no-fp8-param-gather")
    weights = [s["parts"]["weights"] for s in default["memory"]["stages"]]
    kept = [s["parts"]["weights"] for s in off["memory"]["stages"]]
    assert all(w < k / 4 for w, k in zip(weights, kept, strict=True))
    assert default["time"]["parts"]["dp_comm"] <= off["time"]["parts"]["dp_comm"]
    assert (
        default["memory"]["stages"][0]["parts"]["low_precision_weights"]
        == (off["memory"]["stages"][0]["parts"]["low_precision_weights"])
    )


def test_activation_offload_joins_the_per_layer_choice_when_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "8", "-s", "16384",
            "--tp", "8", "--recompute", "auto", "--max-mem", "24.5")  # fmt: skip
    kept = estimate_json(capsys, *args)
    assert not kept["memory"]["fits"]  # even the lightest recompute mix is too much
    assert kept["time"]["parts"]["offload"] == 0
    offloaded = estimate_json(capsys, *args, "--activation-offload")
    assert offloaded["memory"]["fits"]
    assert any(r["option"] == "offload" for r in offloaded["recompute"])
    assert offloaded["time"]["parts"]["offload"] > 0


def test_no_recompute_with_activation_offload_names_the_offloaded_layers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Megatron-Bridge FSDP recipe (no recompute, layers offloaded) fits as it ran, and
    the report says which layers go to the host."""
    args = ("-m", "llama-3-70b", "-d", "gb200", "-n", "64", "--gbs", "256", "-s", "8192",
            "--mbs", "2", "--zero", "3", "--precision", "fp8", "--grad-dtype", "bf16",
            "--recompute", "none")  # fmt: skip
    assert not estimate_json(capsys, *args)["memory"]["fits"]
    code, out, _ = invoke(capsys, *args, "--activation-offload")
    assert code == 0
    assert "— fits" in out
    lines = out.splitlines()
    stage = lines[lines.index("recompute:") + 1]
    assert re.fullmatch(r"  stage 0: layers 0-\d+ offload, \d+-79 none", stage)


EVERY_JOB_FIELD = """\
precision: bf16
optimizer: adam
framework: megatron
attention_kernel: flash
dropout: 0.0
cp_kind: ring
fused_loss: true
grad_reduce_dtype: fp32
finetune: full
moe_capacity_factor: 1.0
tp_comm_overlap: true
fp8_param_gather: true
activation_offload: false
"""
STATED_LAYOUT = ("--tp", "2", "--zero", "1", "--sp", "--schedule", "1f1b")


def test_a_job_file_states_what_no_flag_does_so_strict_can_pass(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(EVERY_JOB_FIELD, encoding="utf-8")
    args = (*LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096", *STATED_LAYOUT)
    code, _, err = invoke(capsys, *args, "--strict")
    assert code == ExitCode.INVALID_INPUT
    assert "--strict forbids assuming" in one_error_line(err)
    code, out, err = invoke(capsys, *args, "--job", str(job), "--strict", "--json")
    assert code == 0, err
    assert "assumed:" not in err
    # the file states the defaults, so the plan is the one priced on assumptions
    assert json.loads(out)["time"] == estimate_json(capsys, *args)["time"]


def test_flags_override_the_job_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("precision: fp8\n", encoding="utf-8")
    args = (*LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096")
    from_file = estimate_json(capsys, *args, "--job", str(job))
    assert from_file["time"] == estimate_json(capsys, *args, "--precision", "fp8")["time"]
    overridden = estimate_json(capsys, *args, "--job", str(job), "--precision", "bf16")
    assert overridden["time"] == estimate_json(capsys, *args)["time"] != from_file["time"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "optimiser: adam\n",
            "unknown key 'optimiser'; did you mean optimizer? (known: precision, optimizer,",
        ),
        ("seq_length: 8192\n", "unknown key 'seq_length' (use --gbs / --seq-len)"),
        ("optimizer: lion\n", "optimizer: Input should be 'adam', 'sgd' or 'muon' (got 'lion')"),
        ("- adam\n", "expected a mapping of job field → value"),
        ("optimizer: [adam\n", "not valid YAML"),
    ],
)
def test_a_bad_job_file_is_one_line_naming_the_file_and_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text, encoding="utf-8")
    code, out, err = invoke(capsys, *LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096",
                            "--job", str(job))  # fmt: skip
    assert code == ExitCode.INVALID_INPUT and out == ""
    line = one_error_line(err)
    assert f"{job}: " in line and expected in line


def test_human_output_prints_memory_per_stage_and_whether_it_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = invoke(capsys, *LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096",
                            "--tp", "2", "--pp", "2")  # fmt: skip
    assert code == 0, err
    assert "memory per device, GiB" in out
    header = next(line for line in out.splitlines() if "stage 0" in line and "part" in line)
    assert "stage 1" in header
    for part in ("activations", "weights", "gradients", "optimizer", "reserve", "total"):
        assert re.search(rf"\b{part}\b\s*│\s*[\d.]+\s*│\s*[\d.]+", out), part
    assert re.search(r"peak [\d.]+ GiB on stage [01]; budget [\d.]+ GiB of [\d.]+ GiB — fits", out)

    code, out, err = invoke(capsys, *LLAMA_8B, "-n", "16", "--gbs", "32", "-s", "4096",
                            "--tp", "2", "--pp", "2", "--max-mem", "10")  # fmt: skip
    assert code == 0, err
    assert re.search(r"— DOES NOT FIT \(over by [\d.]+ GiB\)", out)


def test_a_one_stage_memory_table_keeps_its_title_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Two narrow columns are narrower than the title; rich used to wrap it mid-phrase.
    code, out, err = invoke(capsys, *LLAMA_8B, "-n", "8", "--gbs", "32", "-s", "4096")
    assert code == 0, err
    assert "memory per device, GiB (ndplan model)\n" in out


# ----------------------------------------------------------------------------- recompute auto

TIGHT = ("-n", "8", "--gbs", "64", "-s", "8192", "--tp", "2", "--pp", "2", "--mbs", "2",
         "--max-mem", "50")  # fmt: skip
RANGE = r"\d+(?:-\d+)? [a-z_+]+"


def test_recompute_auto_fits_where_none_does_not(capsys: pytest.CaptureFixture[str]) -> None:
    none = estimate_json(capsys, *LLAMA_8B, *TIGHT, "--recompute", "none")
    auto = estimate_json(capsys, *LLAMA_8B, *TIGHT, "--recompute", "auto")
    assert not none["memory"]["fits"]
    assert auto["memory"]["fits"]
    assert auto["memory"]["peak_bytes"] <= auto["memory"]["budget_bytes"]
    options = {r["option"] for r in auto["recompute"]}
    assert options - {"none"}, "auto had to recompute something"
    # The ranges cover each stage's layers exactly once, in order.
    for stage in auto["memory"]["stages"]:
        ranges = [r for r in auto["recompute"] if r["stage"] == stage["stage"]]
        covered = [i for r in ranges for i in range(r["start"], r["stop"])]
        expected = [i for start, stop in stage["layers"] for i in range(start, stop)]
        assert covered == expected
    # It recomputes only what it must: faster than recomputing everything.
    full = estimate_json(capsys, *LLAMA_8B, *TIGHT, "--recompute", "full")
    assert auto["time"]["step_s"] < full["time"]["step_s"]


def test_recompute_auto_prints_layer_ranges_per_stage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = invoke(capsys, *LLAMA_8B, *TIGHT, "--recompute", "auto")
    assert code == 0, err
    lines = out.splitlines()
    at = lines.index("recompute:")
    ranges = [line.strip() for line in lines[at + 1 :] if line.startswith("  stage ")]
    assert [line.split(":")[0] for line in ranges] == ["stage 0", "stage 1"]
    for line in ranges:
        assert re.fullmatch(rf"stage \d+: layers {RANGE}(?:, {RANGE})*", line), line
    assert ranges[0].startswith("stage 0: layers 0-")
    assert "— fits" in out


def test_an_uneven_split_is_printed_chunk_by_chunk(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3's last chunk keeps room for MTP and the loss; an even split prints no
    such line."""
    code, out, err = invoke(
        capsys,
        *[
            "-m",
            "deepseek-v3",
            "-d",
            "b200",
            "-n",
            "256",
            "--gbs",
            "4096",
            "-s",
            "4096",
            "--pp",
            "16",
            "--ep",
            "8",
        ],
    )
    assert code == 0, err
    assert "layers per chunk: 4 ×15, 1\n" in out
    # Megatron splits layers evenly unless told: the flag that places them as priced.
    flag = 'megatron: --pipeline-model-parallel-layout "E' + "tttt|" * 15 + 'tmL"\n'
    assert flag in out
    code, out, err = invoke(
        capsys,
        *[
            "-m",
            "llama-3-70b",
            "-d",
            "h100",
            "-n",
            "64",
            "--gbs",
            "128",
            "-s",
            "8192",
            "--tp",
            "4",
            "--pp",
            "4",
            "--vpp",
            "5",
            "--cp",
            "2",
        ],
    )
    assert code == 0, err
    assert "layers per chunk" not in out and "megatron: " not in out


def test_no_megatron_layout_flag_for_another_framework(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "64", "-s", "4096")
    uneven = ("--pp", "4", "--dp", "2", "--layers-per-chunk", "7,9,9,7")
    code, out, err = invoke(capsys, *argv, *uneven, "--framework", "torchtitan")
    assert code == 0, err
    assert "layers per chunk: 7, 9 ×2, 7" in out and "megatron: " not in out
    code, out, err = invoke(capsys, *argv, *uneven)
    assert code == 0, err
    assert (
        'megatron: --pipeline-model-parallel-layout "Ettttttt|ttttttttt|ttttttttt|tttttttL"' in out
    )


def test_the_layers_each_stage_holds_are_printed_without_recompute_ranges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With one recompute option everywhere (no ranges to print), each stage lists its
    layers chunk by chunk, with the embedding on the first and the output layer, the
    loss and the MTP module on the last; without a pipeline nothing is listed."""
    argv = ("-m", "llama-3-70b", "-d", "h100", "-n", "64", "--gbs", "128", "-s", "8192")
    argv += ("--tp", "4", "--cp", "2", "--recompute", "none")
    code, out, err = invoke(capsys, *argv, "--pp", "4", "--vpp", "5")
    assert code == 0, err
    lines = out.splitlines()
    at = lines.index("layers by stage:")
    assert lines[at + 1 : at + 5] == [
        "  stage 0: layers 0-3, 16-19, 32-35, 48-51, 64-67 · embedding",
        "  stage 1: layers 4-7, 20-23, 36-39, 52-55, 68-71",
        "  stage 2: layers 8-11, 24-27, 40-43, 56-59, 72-75",
        "  stage 3: layers 12-15, 28-31, 44-47, 60-63, 76-79 · output layer and loss",
    ]
    assert "recompute:" not in lines
    code, out, err = invoke(capsys, *argv, "--pp", "1", "--dp", "8")
    assert code == 0, err
    assert "layers by stage:" not in out
    dsv3 = ("-m", "deepseek-v3", "-d", "b200", "-n", "256", "--gbs", "4096", "-s", "4096")
    code, out, err = invoke(capsys, *dsv3, "--pp", "16", "--ep", "8", "--recompute", "full")
    assert code == 0, err
    assert "  stage 15: layers 60 · output layer and loss · MTP" in out.splitlines()


def test_torchtitan_has_no_tensor_parallelism_without_sp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torchtitan's TP plan always shards the norms over the sequence: --no-sp with tp > 1
    is invalid input naming the fix, in estimate and in a search fixed to it, and a search
    left free keeps SP on wherever TP is on."""
    common = (*LLAMA_8B, "-n", "8", "--gbs", "16", "-s", "4096", "--framework", "torchtitan")
    for command in ("estimate", "search"):
        code = run([command, *common, "--tp", "2", "--no-sp"])
        captured = capsys.readouterr()
        assert code == ExitCode.INVALID_INPUT, captured.err
        line = one_error_line(captured.err)
        assert "not offered by torchtitan" in line and "drop --no-sp" in line
        assert captured.out == ""
    code = run(["search", *common, "--json", "-t", "50"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    plans = json.loads(captured.out)["plans"]
    assert any(p["layout"]["tp"] > 1 for p in plans)
    assert all(p["layout"]["sp"] for p in plans if p["layout"]["tp"] > 1)


@pytest.mark.parametrize(
    ("flag", "framework"),
    [
        ("--activation-offload", "torchtitan"),
        ("--defer-embedding-wgrad", "deepspeed"),
        ("--fp8-param-gather", "mindformers"),
        ("--tp-comm-overlap", "deepspeed"),
    ],
)
def test_a_megatron_switch_asked_of_another_framework_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, framework: str
) -> None:
    """Asked of a framework without it, a switch would go unread and the plan would price
    something else: refused in one line naming the flag and the fix, in estimate and in
    search, with nothing written; the same from a --job file, naming the file."""
    common = (*LLAMA_8B, "-n", "8", "--gbs", "16", "-s", "4096", "--framework", framework)
    csv = tmp_path / "ranking.csv"
    for command in ("estimate", "search"):
        extra = ("--ranking-csv", str(csv)) if command == "search" else ()
        code = run([command, *common, "--precision", "fp8", flag, *extra])
        captured = capsys.readouterr()
        assert code == ExitCode.INVALID_INPUT, captured.err
        line = one_error_line(captured.err)
        assert line.startswith(f"ndplan: error: {flag}: {framework} ")
        assert f"drop {flag} or use --framework megatron" in line
        assert captured.out == "" and not csv.exists()
    field = flag.removeprefix("--").replace("-", "_")
    job = tmp_path / "job.yaml"
    job.write_text(f"{field}: true\n")
    code, out, err = invoke(capsys, *common, "--job", str(job))
    assert code == ExitCode.INVALID_INPUT and out == ""
    assert one_error_line(err).startswith(f"ndplan: error: {job}: {field}: {framework} ")
    code, _, err = invoke(capsys, *common, f"--no-{flag.removeprefix('--')}")
    assert code == 0, err  # saying no is fine


def test_deferred_output_layer_wgrads_shorten_a_pipeline_and_cost_the_last_stage_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipeline = ("-n", "8", "--gbs", "16", "-s", "4096", "--pp", "4", "--dp", "2")
    off = estimate_json(capsys, *LLAMA_8B, *pipeline)
    on = estimate_json(capsys, *LLAMA_8B, *pipeline, "--defer-embedding-wgrad")
    limited = estimate_json(
        capsys, *LLAMA_8B, *pipeline, "--defer-embedding-wgrad", "--wgrad-deferral-limit", "2"
    )
    assert on["time"]["step_s"] < limited["time"]["step_s"] < off["time"]["step_s"]
    last = [s["parts"] for s in on["memory"]["stages"]][-1]
    # 8 deferred micro-batches: each keeps its input (4096 × 4096) and logit gradient
    # (4096 × 128256) in bf16.
    assert last["deferred_wgrad_buffers"] == 8 * 2 * 4096 * (4096 + 128256)
    assert "deferred_wgrad_buffers" not in off["memory"]["stages"][-1]["parts"]
    code, _, err = invoke(capsys, *LLAMA_8B, *pipeline)
    assert "job.defer_embedding_wgrad=False" in err  # off, and said so
    # A limit without the deferral would do nothing: refused, naming the fix.
    code, _, err = invoke(capsys, *LLAMA_8B, *pipeline, "--wgrad-deferral-limit", "2")
    assert code == 3 and "--wgrad-deferral-limit" in one_error_line(err)
    assert "add --defer-embedding-wgrad" in err and "Value error" not in err
    code, _, err = invoke(capsys, *LLAMA_8B, *pipeline, "--wgrad-deferral-limit", "-1")
    assert code == 2 and "--wgrad-deferral-limit" in err and "greater than or equal to 0" in err


def test_packed_documents_shorten_attention_and_count_in_mfu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = ("-n", "8", "--gbs", "32", "-s", "4096", "--dp", "8")
    whole = estimate_json(capsys, *LLAMA_8B, *job)
    packed = estimate_json(capsys, *LLAMA_8B, *job, "--document-tokens", "256")
    assert packed["time"]["step_s"] < whole["time"]["step_s"]
    # The same tokens per second per step second, fewer attention FLOPs per token.
    assert packed["model_tflops_per_device"] < whole["model_tflops_per_device"] * (
        whole["time"]["step_s"] / packed["time"]["step_s"]
    )
    code, out, _ = invoke(capsys, *LLAMA_8B, *job, "--document-tokens", "256")
    assert code == 0 and "seq 4096 (packed documents of 256)" in out.splitlines()[0]
    code, out, err = invoke(capsys, *LLAMA_8B, *job, "--document-tokens", "8192")
    assert code == 0 and "packed" not in out.splitlines()[0]  # as long as the sequence
    assert (  # and said, since the flag then does nothing
        "warning: --document-tokens 8192 is not shorter than the sequence (4096): each "
        "sequence holds one document, as without it"
    ) in err
    code, out, err = invoke(capsys, *LLAMA_8B, *job, "--document-tokens", "256")
    assert "warning" not in err
    code, _, err = invoke(capsys, *LLAMA_8B, *job, "--document-tokens", "0")
    assert code == 2 and "--document-tokens" in err


def test_fewer_micro_batches_than_stages_is_priced_but_warned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """m < pp is allowed (spec/search.md) but the pipeline never fills: one warning on
    stderr naming the fix, in text and JSON, and none once m reaches pp."""
    unfilled = ("-n", "8", "--gbs", "4", "-s", "4096", "--pp", "4", "--dp", "2")
    for json_flag in ((), ("--json",)):
        code, out, err = invoke(capsys, *LLAMA_8B, *unfilled, *json_flag)
        assert code == 0 and out
        warnings = [line for line in err.splitlines() if line.startswith("warning:")]
        assert warnings == [
            "warning: 2 micro-batches for 4 pipeline stages: the pipeline never fills; "
            "raise --gbs, or lower --mbs, --dp or --pp"
        ]
    code, _, err = invoke(capsys, *LLAMA_8B, "-n", "8", "--gbs", "8", "-s", "4096", "--pp", "4")
    assert code == 0 and "warning:" not in err


PP16 = ("-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "64", "-s", "8192", "--pp", "16")


def test_layers_per_chunk_prices_the_split_a_search_chose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The balanced split the search ranks first for Llama 3 8B at pp 16, given back to
    estimate, prices the same step time; the even split is slower."""
    code, out, err = run_search(capsys, *PP16, "--tp", "1", "--vpp", "1", "--mbs", "1", "-t", "1")
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    counts = best["layout"]["layers_per_stage"]
    assert counts == [2] * 14 + [3, 1]  # the head priced as 1.95 layers keeps one beside it
    argv = (*PP16, "--recompute", "auto")
    priced = estimate_json(capsys, *argv, "--layers-per-chunk", ",".join(map(str, counts)))
    assert priced["layout"]["layers_per_stage"] == counts
    assert priced["time"]["step_s"] == pytest.approx(best["time"]["step_s"], rel=1e-12)
    even = estimate_json(capsys, *argv)
    assert even["layout"]["layers_per_stage"] is None
    assert even["time"]["step_s"] > priced["time"]["step_s"]
    code, out, err = invoke(capsys, *argv, "--layers-per-chunk", ",".join(map(str, counts)))
    assert code == 0 and "layers per chunk: 2 ×14, 3, 1" in out


def run_search(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(["search", *argv, "--json", "-j", "1"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("value", "extra", "says"),
    [
        ("2,x", (), "--layers-per-chunk: '2,x' is not a comma-separated list of whole numbers ≥ 0"),
        ("-1," + "2," * 14 + "3", (), "is not a comma-separated list of whole numbers ≥ 0"),
        ("2,2", (), "--layers-per-chunk: 2 numbers for pp·vpp = 16 chunks; give one per chunk"),
        (
            "2,2",
            ("--schedule", "dualpipev"),
            "--layers-per-chunk: 2 numbers for 2·pp (DualPipeV) = 32 chunks; give one per chunk",
        ),
        (
            "3," * 15 + "3",
            (),
            "--layers-per-chunk: the counts sum to 48, the model has 32 layers; make them add up",
        ),
        (
            "2," * 15 + "2",
            ("--framework", "deepspeed"),
            "--layers-per-chunk: deepspeed splits layers evenly; drop the flag",
        ),
    ],
)
def test_layers_per_chunk_that_cannot_be_placed_are_refused(
    capsys: pytest.CaptureFixture[str], value: str, extra: tuple[str, ...], says: str
) -> None:
    code, out, err = invoke(capsys, *PP16, *extra, "--layers-per-chunk", value)
    assert code == ExitCode.INVALID_INPUT and out == ""
    assert says in one_error_line(err)


def test_the_megatron_layout_flag_stays_one_line_on_a_narrow_terminal(capsys, monkeypatch) -> None:
    monkeypatch.setattr(output.stdout, "_width", 40)
    chunks = "3,1" + ",2" * 14
    code = run(
        [
            "estimate",
            "-m",
            "llama-3-8b",
            "-d",
            "h100",
            "-n",
            "8",
            "--gbs",
            "16",
            "-s",
            "2048",
            "--pp",
            "8",
            "--vpp",
            "2",
            "--layers-per-chunk",
            chunks,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    expected = '--pipeline-model-parallel-layout "Ettt|t' + "|tt" * 14 + 'L"'
    assert any(line.endswith(expected) for line in out.splitlines()), out


@pytest.mark.parametrize(
    ("precision", "basis"), [("bf16", "bf16"), ("fp8", "fp8"), ("fp8-blockwise", "fp8")]
)
def test_the_utilisations_name_the_peak_they_are_of(capsys, precision: str, basis: str) -> None:
    """MFU and HFU are taken against the training precision's dense peak (an fp8 run's is
    twice the bf16 one), and the line says which, with the peak's figure."""
    argv = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "64", "-s", "4096")
    code, out, err = invoke(capsys, *argv, "--precision", precision)
    assert code == 0, err
    peak = {"bf16": "989", "fp8": "1,979"}[basis]
    line = next(line for line in out.splitlines() if "MFU" in line)
    assert line.endswith(f"(of the {basis} dense peak, {peak} TFLOP/s)"), line
    mfu = estimate_json(capsys, *argv, "--precision", precision)["mfu"]
    assert f"MFU {100 * mfu:.1f}%" in line
