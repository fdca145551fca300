"""``ndplan models`` and ``ndplan models show`` (issue 3), and the model resolver behind them.

Results on stdout, one ``assumed: ...`` line on stderr under them; a bad input is
exit 3 with exactly one line on stderr naming the field, and no traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ndplan.adapters.readers.catalog import builtin_presets
from ndplan.adapters.readers.hf import read_hf_config
from ndplan.adapters.readers.resolve import load_model, resolve_model
from ndplan.bootstrap import bootstrap
from ndplan.cli import output
from ndplan.cli.app import run
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.counting import count_flops, megatron_closed_form_flops
from ndplan.core.errors import InvalidInputError, PluginError
from ndplan.core.model import DenseFFN, LayerKind, ModelSpec, StandardAttention
from ndplan.plugins.hookspecs import hookimpl

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables at 200 columns, whatever the terminal the tests run in."""
    monkeypatch.setattr(output.stdout, "_width", 200)


def invoke(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def show_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = invoke(capsys, "models", "show", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# ----------------------------------------------------------------------------- listing


def test_models_json_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(capsys, "models", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["id"] for r in rows] == sorted(builtin_presets())
    assert len(rows) == 65
    by_id = {r["id"]: r for r in rows}
    assert by_id["llama-3-8b"]["total_parameters"] == 8_030_261_248
    assert by_id["mixtral-8x7b"]["active_parameters"] == 12_879_925_248
    assert by_id["deepseek-v3"]["num_layers"] == 61
    for row in rows:
        if row["id"] == "nemotron-h-8b":
            assert row["total_parameters"] is None
            assert "mamba" in row["refused"]
        else:
            assert row["refused"] is None, row
            assert isinstance(row["total_parameters"], int)
            assert isinstance(row["active_parameters"], int)
            assert 0 < row["active_parameters"] <= row["total_parameters"]
            assert row["display_name"] and row["family"] and row["source"]


def test_models_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(capsys, "models")
    assert code == 0, err
    assert "total (B)" in out and "active (B)" in out
    for preset_id in builtin_presets():
        assert preset_id in out
    assert "405.853" in out  # Llama 3.1 405B in billions
    assert "nemotron-h-8b: refused: layer type 'mamba'" in out
    assert err == ""


def test_listing_survives_a_broken_preset_plugin() -> None:
    """A preset that cannot be read is listed with its reason; the listing goes on."""
    from ndplan.cli.models import _list_row

    def broken():
        raise RuntimeError("disk on fire")

    plugin = types.SimpleNamespace(
        __name__="broken-presets",
        ndplan_register_presets=hookimpl(lambda registry: registry.add("broken-1b", broken)),
    )
    comps = bootstrap(entry_points=False, extra=[plugin])
    rows = {e.name: _list_row(comps, e) for e in comps.presets.entries()}
    assert "disk on fire" in rows["broken-1b"]["refused"]
    assert rows["llama-3-8b"]["total_parameters"] == 8_030_261_248


# ----------------------------------------------------------------------------- show


def test_show_json_has_integer_counts_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-70B at s = 8192: the integer counts, and training FLOPs per token under both
    attention conventions (the causal one equals Megatron-LM's closed form)."""
    report = show_json(capsys, "llama-3-70b", "--seq-len", "8192")
    assert report["id"] == "llama-3-70b"
    assert type(report["total_parameters"]) is int
    assert type(report["active_parameters"]) is int
    assert report["total_parameters"] == report["active_parameters"] == 70_553_706_496
    model = read_hf_config(builtin_presets()["llama-3-70b"])
    s = 8192
    assert report["training_flops_per_token"] * s == megatron_closed_form_flops(model, 1, s)
    h, a, d, layers = 8192, 64, 128, 80
    assert report["training_flops_per_token_full_attention"] - report[
        "training_flops_per_token"
    ] == (6 * s * a * d * layers)
    assert report["training_flops_per_token"] == 3 * report["forward_flops_per_token"]
    assert report["flops"]["causal"]["attention"] == "causal"
    assert report["flops"]["full"]["attention"] == "full"
    assert report["layer_kinds"][0]["count"] == layers
    assert report["layer_kinds"][0]["attention"]["num_kv_heads"] == 8
    assert report["parameters"]["embedding"] == 128256 * h
    assert report["assumptions"] == []


def test_show_without_seq_len_has_no_flops(capsys: pytest.CaptureFixture[str]) -> None:
    report = show_json(capsys, "llama-3-8b")
    assert "training_flops_per_token" not in report
    assert report["total_parameters"] == 8_030_261_248


def test_show_moe_and_mtp(capsys: pytest.CaptureFixture[str]) -> None:
    report = show_json(capsys, "deepseek-v3", "--seq-len", "4096")
    assert report["total_parameters"] == 671_026_404_352
    assert report["active_parameters"] == 37_552_282_624
    assert report["mtp_parameters"] == 11_610_067_968
    assert report["layer_order"] == [["mla+dense", 3], ["mla+moe", 58]]
    assert report["mtp_kind"]["count"] == 1
    ffn = report["layer_kinds"][1]["ffn"]  # node-limited routing: 8 experts from 4 of 8 groups
    assert (ffn["top_k"], ffn["routing_groups"], ffn["routing_groups_per_token"]) == (8, 8, 4)
    code, out, err = invoke(capsys, "models", "show", "deepseek-v3")
    assert code == 0, err
    assert "top-8 from 4 of 8 groups" in out
    model = read_hf_config(builtin_presets()["deepseek-v3"])
    assert report["training_flops_per_token"] == count_flops(model, 4096).training_flops_per_token


def test_show_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(capsys, "models", "show", "qwen3-next-80b-a3b", "--seq-len", "4096")
    assert code == 0, err
    assert "layer order: (linear+moe ×3, attn+moe) ×12" in out
    for text in (
        "layer kinds",
        "gated delta-net",
        "parameters",
        "routed experts",
        "router",
        "79,674,391,296",  # total
        "3,874,929,408",  # active per token
        "active per token",
        "training (3× forward)",
        "full attention",
    ):
        assert text in out, text


def test_show_mixtral_table_lists_active(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = invoke(capsys, "models", "show", "Mixtral-8x7B")  # an alias
    assert code == 0
    assert "46,702,792,704" in out and "12,879,925,248" in out
    assert "preset mixtral-8x7b" in out


def test_show_a_tied_head(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = invoke(capsys, "models", "show", str(CONFIGS / "model_dir"))
    assert code == 0
    assert "tied to embedding" in out


@pytest.mark.parametrize("target", ["model_dir", "model_dir/config.json"])
def test_show_reads_a_file_or_a_directory(capsys: pytest.CaptureFixture[str], target: str) -> None:
    report = show_json(capsys, str(CONFIGS / target))
    h, vocab, f = 256, 1024, 688
    assert report["id"] is None
    assert report["path"].endswith(target)
    assert report["total_parameters"] == vocab * h + 2 * (4 * h * h + 3 * h * f + 2 * h) + h


def test_unknown_model_type_works_with_one_assumed_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = invoke(capsys, "models", "show", str(CONFIGS / "unknown_model_type.json"))
    assert code == 0
    assert "acme_lm" in out
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("assumed: model.model_type=acme_lm")
    report = show_json(capsys, str(CONFIGS / "unknown_model_type.json"))
    assert [a["field"] for a in report["assumptions"]] == ["model.model_type"]


def test_strict_turns_the_assumption_into_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(
        capsys, "models", "show", str(CONFIGS / "unknown_model_type.json"), "--strict"
    )
    assert code == 3
    assert out == ""
    (line,) = err.splitlines()
    assert "model.model_type" in line and "--strict" in line


def test_strict_on_a_complete_config_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert show_json(capsys, "llama-3-8b", "--strict") == show_json(capsys, "llama-3-8b")


# ----------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("target", "needles"),
    [
        ("not_json.json", ["not_json.json", "not valid JSON"]),
        ("wrong_type.json", ["'hidden_size'", "must be an integer", "'4096'"]),
        ("negative_layers.json", ["'num_hidden_layers'", "-2"]),
        ("heads_not_dividing_hidden.json", ["hidden_size(1000)", "num_attention_heads(7)"]),
        ("missing_hidden_size.json", ["missing required field 'hidden_size'"]),
        ("llava-1.5-7b-hf.json", ["missing required field 'hidden_size'"]),
        ("nemotron-h-8b", ["'mamba'", "not supported"]),
        ("llama-3-7b", ["unknown model preset 'llama-3-7b'", "did you mean", "llama-3-70b"]),
        ("mixtrl-8x7b", ["did you mean", "mixtral-8x7b"]),
        ("no/such/config.json", ["no such file"]),
        ("<the fixtures folder>", ["holds no config.json"]),
    ],
)
def test_bad_inputs_exit_3_with_one_line(
    capsys: pytest.CaptureFixture[str], target: str, needles: list[str]
) -> None:
    """Fixture files by path; preset names and missing paths as typed."""
    if target == "<the fixtures folder>":
        target = str(CONFIGS)
    elif (CONFIGS / target).is_file():
        target = str(CONFIGS / target)
    code, out, err = invoke(capsys, "models", "show", target)
    assert code == 3
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ndplan: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


def test_bad_seq_len_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = invoke(capsys, "models", "show", "llama-3-8b", "--seq-len", "0")
    assert code == 2
    assert "Traceback" not in err


def test_end_to_end_subprocess() -> None:
    """The installed entry point: exit code 3 and one line on stderr for a non-JSON file."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ndplan.cli.app import main; main()",
            "models",
            "show",
            str(CONFIGS / "not_json.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert "not valid JSON" in proc.stderr


# ----------------------------------------------------------------------------- resolver


def tiny_model(name: str = "plugin-tiny") -> ModelSpec:
    kind = LayerKind(
        name="attn+dense",
        attention=StandardAttention(num_heads=2, num_kv_heads=2, head_dim=8),
        ffn=DenseFFN(intermediate_size=32),
    )
    return ModelSpec(name=name, hidden_size=16, vocab_size=100, kinds=(kind,), layers=(0, 0))


def test_resolver_prefers_paths_then_presets() -> None:
    comps = bootstrap(entry_points=False)
    recorder = AssumptionRecorder()
    by_alias = resolve_model(comps, "meta-llama/Meta-Llama-3-70B", recorder)
    assert by_alias.preset_id == "llama-3-70b"
    assert by_alias.meta["family"] == "llama"
    by_path = resolve_model(comps, str(CONFIGS / "model_dir"), recorder)
    assert (by_path.preset_id, by_path.reader) == (None, "huggingface")
    assert load_model(comps, "llama-3-8b", recorder) == read_hf_config(
        builtin_presets()["llama-3-8b"], origin="preset 'llama-3-8b'"
    )


def test_resolver_a_folder_named_like_a_preset_is_the_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "llama-3-8b").mkdir()
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model(bootstrap(entry_points=False), "llama-3-8b", AssumptionRecorder())
    assert resolved.preset_id == "llama-3-8b"


def test_resolver_accepts_a_plugin_preset_and_names_a_broken_one() -> None:
    def broken():
        raise RuntimeError("disk on fire")

    def register(registry):
        registry.add("plugin-tiny", tiny_model)
        registry.add("plugin-broken", broken)

    plugin = types.SimpleNamespace(
        __name__="acme-presets", ndplan_register_presets=hookimpl(register)
    )
    comps = bootstrap(entry_points=False, extra=[plugin])
    recorder = AssumptionRecorder()
    assert load_model(comps, "plugin-tiny", recorder) == tiny_model()
    with pytest.raises(PluginError, match=r"'plugin-broken' of plugin 'acme-presets'.*fire"):
        load_model(comps, "plugin-broken", recorder)


def test_resolver_refuses_an_empty_name() -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        load_model(bootstrap(entry_points=False), " ", AssumptionRecorder())


def test_the_groups_json_flag_reaches_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(capsys, "models", "--json", "show", "llama-3-8b")
    assert code == 0, err
    code, same, err = invoke(capsys, "models", "show", "llama-3-8b", "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(same)
