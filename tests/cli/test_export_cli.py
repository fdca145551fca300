"""``--export FORMAT --out FILE`` (spec/interfaces.md § Configs out) on search, estimate
and balance: the chosen plan written as its framework's config.

- the file states the plan the search ranked (or estimate priced), and the ndplan format
  reads back through ``search --baseline`` as the same plan;
- bad combinations fail before any work, with one line, exit 3, and no file: --out
  without --export, --export without --out, an unknown format, a framework's format for a
  plan of another framework, an existing file without --force;
- a plan that does not fit is not written (exit 1);
- a third-party exporter registered through the hook gets the plan; one that raises is
  a plugin error (exit 4) naming it, and leaves no file.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ndplan.cli import output
from ndplan.cli.app import run
from ndplan.core.errors import ExitCode

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
INPUTS = ("-m", "llama-3-8b", "-d", "h100", "-n", "8", "--gbs", "32", "-s", "4096")
PROBLEM = (*INPUTS, "-j", "1")
TIGHT = (*PROBLEM, "--max-mem", "24")
"""Memory is tight: the best plans recompute some layers and not others."""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(output.stdout, "_width", 200)
    monkeypatch.syspath_prepend(str(PLUGINS))


def invoke(capsys, *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def bash_array(path: Path) -> list[str]:
    out = subprocess.run(
        ["bash", "-c", f'source "{path}"; printf "%s\\n" "${{NDPLAN_ARGS[@]}}"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.splitlines()


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_search_exports_the_plan_it_ranks_first_or_the_one_it_explains(
    capsys, tmp_path: Path
) -> None:
    code, out, err = invoke(capsys, "search", *TIGHT, "--json", "-t", "3")
    assert code == 0, err
    plans = json.loads(out)["plans"]
    for rank in (1, 3):
        target = tmp_path / f"plan{rank}.sh"
        code, out, err = invoke(
            capsys, "search", *TIGHT, "-t", "3", "--explain", str(rank), "--export", "megatron",
            "--out", str(target),
        )  # fmt: skip
        assert code == 0, err
        assert f"wrote plan {rank} as megatron to {target}" in err
        lay = plans[rank - 1]["layout"]
        args = bash_array(target)
        assert value(args, "--tensor-model-parallel-size") == str(lay["tp"])
        assert value(args, "--pipeline-model-parallel-size") == str(lay["pp"])
        assert value(args, "--context-parallel-size") == str(lay["cp"])
        assert value(args, "--micro-batch-size") == str(lay["mbs"])
        assert value(args, "--global-batch-size") == "32"
        assert ("--use-distributed-optimizer" in args) == (lay["zero"] >= 1)
        # A per-layer mix Megatron cannot state is written, said in the file and on stderr.
        options = {r["option"] for r in plans[rank - 1]["recompute"]}
        inexact = len(options) > 1
        assert (
            "# caveat: megatron: the plan recomputes per layer" in target.read_text()
        ) == inexact
        assert ("warning: megatron: the plan recomputes per layer" in err) == inexact


def test_the_ndplan_format_reads_back_as_the_same_plan(capsys, tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    code, out, err = invoke(
        capsys, "search", *TIGHT, "--json", "--export", "ndplan", "--out", str(target)
    )
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    written = json.loads(target.read_text())
    assert {k: v for k, v in written.items() if k != "inputs"} == best
    code, out, err = invoke(capsys, "search", *TIGHT, "--json", "--baseline", str(target))
    assert code == 0, err
    baseline = json.loads(out)["baseline"]
    assert baseline["rank"] == 1 and baseline["gap"] == 0.0
    assert baseline["plan"]["layout"] == best["layout"]
    assert "warning" not in err  # this problem's own file
    # Another problem's file: its degrees are placed, and the user hears whose they were.
    other = [*TIGHT]
    other[other.index("--gbs") + 1] = "64"
    code, out, err = invoke(capsys, "search", *other, "--json", "--baseline", str(target))
    assert code == 0, err
    assert json.loads(out)["baseline"]["stated"]["tp"] == best["layout"]["tp"]
    assert f"warning: --baseline {target} was priced for another problem: gbs 32 (here 64);" in err
    assert "its degrees are placed in this one as given" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--out", "{out}"), "--out {out}: names the file --export writes; add --export megatron"),
        (("--export", "megatron"), "--export megatron: give the file to write with --out FILE"),
        (("--export", "xml", "--out", "{out}"), "--export xml: unknown format; use one of "),
        (
            ("--export", "torchtitan", "--out", "{out}"),
            "--export torchtitan: the plan is priced for megatron, whose options torchtitan may "
            "lack; add --framework torchtitan (or --export ndplan)",
        ),
    ],
    ids=["out-alone", "export-alone", "unknown-format", "other-framework"],
)
@pytest.mark.parametrize("command", ["search", "estimate"])
def test_bad_export_flags_are_one_line_and_write_nothing(
    capsys, tmp_path: Path, command: str, flags: tuple[str, ...], message: str
) -> None:
    target = tmp_path / "plan.out"
    argv = [f.format(out=target) for f in flags]
    code, out, err = invoke(capsys, command, *(PROBLEM if command == "search" else INPUTS), *argv)
    assert code == ExitCode.INVALID_INPUT
    (line,) = err.splitlines()
    assert line.startswith(f"ndplan: error: {message.format(out=target)}")
    assert out == "" and not target.exists()


def test_an_existing_file_is_kept_without_force(capsys, tmp_path: Path) -> None:
    target = tmp_path / "plan.sh"
    target.write_text("mine\n")
    code, out, err = invoke(
        capsys, "search", *PROBLEM, "--export", "megatron", "--out", str(target)
    )
    assert code == ExitCode.INVALID_INPUT
    assert err == f"ndplan: error: --out {target}: exists; pass --force to overwrite it\n"
    assert target.read_text() == "mine\n" and out == ""
    code, out, err = invoke(
        capsys, "search", *PROBLEM, "--export", "megatron", "--out", str(target), "--force"
    )
    assert code == 0, err
    assert "NDPLAN_ARGS=(" in target.read_text()


def test_estimate_exports_its_plan_and_refuses_one_that_does_not_fit(
    capsys, tmp_path: Path
) -> None:
    target = tmp_path / "plan.toml"
    flags = (*INPUTS, "--framework", "torchtitan", "--tp", "2", "--pp", "2", "--recompute", "full")
    code, out, err = invoke(
        capsys, "estimate", *flags, "--export", "torchtitan", "--out", str(target)
    )
    assert code == 0, err
    text = target.read_text()
    assert 'mode = "full"' in text and "tensor_parallel_degree = 2" in text
    too_big = tmp_path / "big.sh"
    code, out, err = invoke(
        capsys, "estimate", "-m", "llama-3-70b", "-d", "h100", "-n", "8", "--gbs", "8", "-s", "8192",
        "--export", "megatron", "--out", str(too_big),
    )  # fmt: skip
    assert code == ExitCode.NO_FEASIBLE_PLAN
    assert (
        err.startswith("ndplan: error: --export: the plan is over memory by ")
        and len(err.splitlines()) == 1
    )
    assert out == "" and not too_big.exists()


def test_balance_exports_the_balanced_placement(capsys, tmp_path: Path) -> None:
    target = tmp_path / "plan.sh"
    flags = ("-m", "llama-3-8b", "-d", "h100", "-n", "16", "--gbs", "64", "-s", "8192", "--pp", "16")  # fmt: skip
    code, out, err = invoke(
        capsys, "balance", *flags, "--json", "--export", "megatron", "--out", str(target)
    )
    assert code == 0, err
    counts = json.loads(out)["balanced"]["layout"]["layers_per_stage"]
    spelled = value(bash_array(target), "--pipeline-model-parallel-layout")
    assert [part.count("t") for part in spelled.split("|")] == counts


def test_a_plugins_exporter_gets_the_plan(capsys, tmp_path: Path) -> None:
    plan_exporter = pytest.importorskip("plan_exporter")
    target = tmp_path / "degrees.txt"
    code, out, err = invoke(
        capsys, "-p", "plan_exporter", "search", *PROBLEM, "--json", "--export", "degrees", "--out", str(target)
    )  # fmt: skip
    assert code == 0, err
    best = json.loads(out)["plans"][0]["layout"]
    assert plan_exporter.RENDERED[-1].layout.tp == best["tp"]
    assert target.read_text().splitlines()[0] == f"tp {best['tp']}"
    assert "warning: degrees: only the degrees are written" in err
    broken = tmp_path / "broken.txt"
    code, out, err = invoke(
        capsys,
        "-p",
        "plan_exporter",
        "search",
        *PROBLEM,
        "--export",
        "broken",
        "--out",
        str(broken),
    )
    assert code == ExitCode.PLUGIN_ERROR
    assert err == "ndplan: error: export format 'broken' failed: KeyError: 'layout'\n"
    assert not broken.exists()


@pytest.mark.parametrize("recompute", ["selective", "full", "none"])
def test_megatron_arguments_read_back_as_the_same_layout(
    capsys, tmp_path: Path, recompute: str
) -> None:
    """Round trip (spec: read → export unchanged → read gives the same plan): a plan
    Megatron states exactly, exported and given back as --baseline, is the best plan."""
    target = tmp_path / "plan.sh"
    flags = (*TIGHT, "--recompute", recompute)
    code, out, err = invoke(
        capsys, "search", *flags, "--json", "--export", "megatron", "--out", str(target)
    )
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    assert "caveat" not in target.read_text()
    code, out, err = invoke(capsys, "search", *flags, "--json", "--baseline", str(target))
    assert code == 0, err
    baseline = json.loads(out)["baseline"]
    assert baseline["rank"] == 1 and baseline["gap"] == 0.0
    assert baseline["plan"]["layout"] == best["layout"]


@pytest.mark.parametrize(("framework", "suffix"), [("megatron", "sh"), ("torchtitan", "toml")])
def test_a_stand_in_reads_back_at_its_own_price(
    capsys, tmp_path: Path, framework: str, suffix: str
) -> None:
    """A per-layer mix the framework cannot state is written as the fastest setting it
    states; given back as --baseline in a search of that framework, it is priced as what
    the framework states at that layout (recompute stated): the stand-in's own step."""
    target = tmp_path / f"plan.{suffix}"
    flags = (*TIGHT, "--framework", framework)
    code, out, err = invoke(
        capsys, "search", *flags, "--json", "--export", framework, "--out", str(target)
    )
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    written = re.search(r"fits by ndplan's estimate: ([\d.]+) s per step", err)
    assert written is not None, err  # the case is a per-layer mix
    code, out, err = invoke(capsys, "search", *flags, "--json", "--baseline", str(target))
    assert code == 0, err
    baseline = json.loads(out)["baseline"]
    # A setting no policy names (Megatron's block recompute here) is read as stated, and
    # said; one that a policy names (torchtitan's every layer whole here) as that policy.
    policy = baseline["plan"]["layout"]["recompute"]
    assert policy == {"megatron": "stated", "torchtitan": "full"}[framework]
    assert ("(recompute stated), which may be faster than it" in err) == (policy == "stated")
    assert f"{baseline['plan']['time']['step_s']:.3f}" == written.group(1)
    assert {k: v for k, v in baseline["plan"]["layout"].items() if k != "recompute"} == {
        k: v for k, v in best["layout"].items() if k != "recompute"
    }


@pytest.mark.parametrize(
    ("framework", "name", "recompute"),
    [
        *((fw, name, r) for fw, name in (("torchtitan", "plan.toml"), ("mindformers", "plan.yaml"))
          for r in ("selective", "full", "none")),
        # A name that says nothing of the format is read by what the file holds (the keys
        # of both, micro_batch_size and the like, would pass for Megatron's argparse names).
        ("torchtitan", "plan.out", "full"),
        ("mindformers", "plan.out", "full"),
    ],
)  # fmt: skip
def test_framework_configs_read_back_as_the_same_layout(
    capsys, tmp_path: Path, framework: str, name: str, recompute: str
) -> None:
    """Round trip for torchtitan's TOML and MindFormers' YAML, as for Megatron's arguments."""
    target = tmp_path / name
    flags = (*TIGHT, "--framework", framework, "--recompute", recompute)
    code, out, err = invoke(
        capsys, "search", *flags, "--json", "--export", framework, "--out", str(target)
    )
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    code, out, err = invoke(capsys, "search", *flags, "--json", "--baseline", str(target))
    assert code == 0, err
    baseline = json.loads(out)["baseline"]
    assert baseline["rank"] == 1 and baseline["gap"] == 0.0
    assert baseline["plan"]["layout"] == best["layout"]


@pytest.mark.parametrize("name", ["ds_config.json", "ds_config"])
def test_a_deepspeed_config_as_baseline_names_what_it_states_and_what_to_add(
    capsys, tmp_path: Path, name: str
) -> None:
    """DeepSpeed takes TP and PP from the model code, so its JSON cannot place a layout:
    one line (exit 3) with the degrees it does state, as the plan exported it, and the
    --baseline that adds the rest."""
    target = tmp_path / name
    flags = (*PROBLEM, "--framework", "deepspeed")
    code, out, err = invoke(
        capsys, "search", *flags, "--json", "--export", "deepspeed", "--out", str(target)
    )
    assert code == 0, err
    lay = json.loads(out)["plans"][0]["layout"]
    code, out, err = invoke(capsys, "search", *flags, "--baseline", str(target))
    assert code == ExitCode.INVALID_INPUT and out == ""
    stated = f"dp={lay['dp']},mbs={lay['mbs']},zero={lay['zero']}"
    assert err.strip().splitlines()[-1] == (
        f"ndplan: error: --baseline {target}: a DeepSpeed config states {stated} but not TP "
        f"or PP, which DeepSpeed takes from the model code; give them too: --baseline "
        f"tp=TP,pp=PP,{stated}"
    )


def test_an_uneven_split_reads_back_as_the_same_plan(capsys, tmp_path: Path) -> None:
    """The best torchtitan plans here place their layers with the search's balanced split:
    the ndplan format carries it, and --baseline ranks it first with no warning."""
    flags = (*TIGHT, "--framework", "torchtitan")
    target = tmp_path / "plan.json"
    code, out, err = invoke(
        capsys, "search", *flags, "--json", "--export", "ndplan", "--out", str(target)
    )
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    assert best["layout"]["layers_per_stage"] is not None
    code, out, err = invoke(capsys, "search", *flags, "--json", "--baseline", str(target))
    assert code == 0, err
    baseline = json.loads(out)["baseline"]
    assert baseline["rank"] == 1 and baseline["gap"] == 0.0
    assert baseline["plan"]["layout"] == best["layout"]
    assert "layers per chunk" not in err


@pytest.mark.parametrize(
    ("framework", "recompute", "said"),
    [("megatron", None, True), ("torchtitan", None, True), ("megatron", "selective", False),
     ("mindformers", None, False), ("megatron", "stated", False),
     ("torchtitan", "stated", False)],
)  # fmt: skip
def test_the_report_says_what_a_per_layer_choice_costs_in_the_framework(
    capsys, tmp_path: Path, framework: str, recompute: str | None, said: bool
) -> None:
    """Under the best plan: where its framework's config cannot state its per-layer
    recompute (Megatron, torchtitan), the fastest setting it states and its price, the
    same as --export writes; nothing where the plan's recompute is stated exactly (a fixed
    policy; MindFormers' per-stage counts). --json is unchanged."""
    flags = (*TIGHT, "--framework", framework, *(("--recompute", recompute) if recompute else ()))
    code, out, err = invoke(capsys, "search", *flags, "-t", "3")
    assert code == 0, err
    text = " ".join(out.split())  # the line may wrap at the terminal's width
    head = f"{framework}'s config cannot state this plan's per-layer recompute: "
    assert (head in text) == said
    code, json_out, err = invoke(capsys, "search", *flags, "-t", "3", "--json")
    assert code == 0 and "cannot state" not in json_out
    if not said:
        return
    target = tmp_path / "plan.out"
    code, _, err = invoke(
        capsys, "search", *flags, "-t", "3", "--export", framework, "--out", str(target)
    )
    assert code == 0, err
    written = re.search(r"written as (.+?), the fastest setting it states that fits by ndplan's "
                        r"estimate: ([\d.]+) s per step", err)  # fmt: skip
    assert written is not None, err
    described, seconds = written.groups()
    assert (
        f"the fastest setting it states that fits, {described}, runs {seconds} s per step" in text
    )
    assert float(seconds) > json.loads(json_out)["plans"][0]["time"]["step_s"]
    assert f"--recompute stated ranks only plans {framework} runs as priced" in text
    # The file's own prediction is of what it states: the stand-in first, the plan beside.
    best = json.loads(json_out)["plans"][0]["time"]["step_s"]
    predicted = next(line for line in target.read_text().splitlines() if "predicted:" in line)
    assert predicted.startswith(f"# predicted: step {seconds} s, peak ")
    assert f" as written ({described}); the plan's own per-layer recompute: " in predicted
    assert f"step {best:.3f} s, peak " in predicted.split("own per-layer recompute: ")[1]
    # Ranking what the framework states finds a plan at least as fast as that stand-in
    # (which is one of the layouts it weighs), and it runs as priced.
    code, stated_out, err = invoke(
        capsys, "search", *flags, "--recompute", "stated", "-t", "3", "--json"
    )
    assert code == 0, err
    assert json.loads(stated_out)["plans"][0]["time"]["step_s"] <= float(seconds)
