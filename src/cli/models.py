"""``ndplan models``: the built-in presets, and one model's parameters and FLOPs by part.

Thin: resolve the model (``adapters.readers.resolve``), count it (``core.counting``),
render. ``--json`` prints the same numbers as the tables, exactly.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ndplan.adapters.readers.resolve import ResolvedModel, read_preset, resolve_model
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.counting import (
    FlopCount,
    ParameterCount,
    count_flops,
    count_parameters,
    kind_parameters,
)
from ndplan.core.errors import NdplanError
from ndplan.core.model import (
    DenseFFN,
    LatentAttention,
    LayerKind,
    LinearAttention,
    ModelSpec,
    MoEFFN,
    StandardAttention,
)

from .options import Json, Strict, state
from .output import note, print_json, stdout, table

app = typer.Typer(
    name="models",
    rich_markup_mode=None,
    no_args_is_help=False,
)

PART_LABELS = {
    "embedding": "embedding",
    "position_embedding": "position embedding",
    "attention": "attention",
    "ffn": "FFN (dense)",
    "experts": "routed experts",
    "shared_experts": "shared experts",
    "router": "router",
    "norms": "norms",
    "extra": "other",
    "output_head": "output head",
    "vision": "vision tower",
}
FLOP_LABELS = {
    "attention_projections": "attention projections",
    "core_attention": "core attention",
    "ffn": "FFN / routed experts (top-k)",
    "shared_experts": "shared experts",
    "router": "router",
    "extra": "other",
    "logits": "logits",
}


# ----------------------------------------------------------------------------- list


@app.callback(invoke_without_command=True)
def models(ctx: typer.Context, as_json: Json = False) -> None:
    """List the built-in model presets with their parameter counts.

    A preset the reader refuses (hybrid Mamba) is listed with the reason instead of counts.

    Examples: ndplan models · ndplan models --json · ndplan models show llama-3-70b --seq-len 8192
    """
    if ctx.invoked_subcommand is not None:
        return
    comps = state(ctx).components()
    rows = [_list_row(comps, entry) for entry in comps.presets.entries()]
    if as_json:
        print_json(rows)
        return
    listing = table(
        "model presets",
        [
            "id",
            "name",
            "family",
            ("total (B)", "right"),
            ("active (B)", "right"),
            ("layers", "right"),
            ("hidden", "right"),
            "source",
        ],
        [
            (
                r["id"],
                r["display_name"],
                r["family"],
                "refused" if r["refused"] else _billions(r["total_parameters"]),
                "" if r["refused"] else _billions(r["active_parameters"]),
                r["num_layers"],
                r["hidden_size"],
                _short_source(r["source"]),
            )
            for r in rows
        ],
    )
    # Numbers are never cut; ids (what users type) fold rather than end in an ellipsis.
    listing.columns[0].overflow = "fold"
    for column in listing.columns[3:7]:
        column.no_wrap = True
    stdout.print(listing)
    for r in rows:
        if r["refused"]:
            stdout.print(f"{r['id']}: refused: {r['refused']}", markup=False, soft_wrap=True)
    if not rows:
        note("the preset registry is empty")


def _list_row(comps: Any, entry: Any) -> dict[str, Any]:
    """One preset's listing entry; a refusal or a failure becomes the row's reason."""
    row: dict[str, Any] = {
        "id": entry.name,
        "display_name": entry.name,
        "family": "",
        "model_type": None,
        "total_parameters": None,
        "active_parameters": None,
        "mtp_parameters": None,
        "num_layers": None,
        "hidden_size": None,
        "source": "",
        "registered_by": entry.plugin,
        "refused": None,
    }
    try:
        resolved = read_preset(comps, entry.name, AssumptionRecorder())
    except NdplanError as exc:
        row["refused"] = _strip_origin(str(exc), entry.name)
        return row
    except Exception as exc:  # the listing never crashes on one bad preset
        row["refused"] = f"{type(exc).__name__}: {exc}"
        return row
    spec, meta = resolved.spec, resolved.meta
    params = count_parameters(spec)
    row.update(
        display_name=meta.get("display_name") or spec.name,
        family=meta.get("family", ""),
        model_type=spec.model_type,
        total_parameters=params.total_parameters,
        active_parameters=params.active_parameters,
        mtp_parameters=params.mtp_parameters,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        source=meta.get("source") or spec.source,
    )
    return row


def _strip_origin(message: str, preset_id: str) -> str:
    return message.removeprefix(f"preset '{preset_id}': ")


def _short_source(source: str) -> str:
    """A table-sized source: the HF repo id, or the citation up to its parenthesis."""
    marker = "huggingface.co/"
    if marker in source:
        repo = source.split(marker, 1)[1].split("/blob/", 1)[0]
        return repo.split("/tree/", 1)[0]
    short = source.split(" (", 1)[0]
    return short.split()[0] if short.startswith("http") else short


def _billions(n: int | None) -> str:
    return "" if n is None else f"{n / 1e9:,.3f}"


# ----------------------------------------------------------------------------- show


@app.command()
def show(
    ctx: typer.Context,
    name_or_path: Annotated[
        str,
        typer.Argument(
            metavar="NAME_OR_PATH",
            help="A preset id or alias, a HuggingFace config.json, or a model directory.",
            show_default=False,
        ),
    ],
    seq_len: Annotated[
        int | None,
        typer.Option(
            "--seq-len",
            min=1,
            metavar="S",
            help="Also print FLOPs per token at this sequence length (causal and full attention).",
            show_default=False,
        ),
    ] = None,
    as_json: Json = False,
    strict: Strict = False,
) -> None:
    """One model by part: layer kinds, parameters, and FLOPs per token (with --seq-len).

    Training FLOPs are model FLOPs (3 × forward, no recompute). Core attention is counted
    causally (what a causal flash kernel runs) with full attention beside it for comparison.

    Examples: ndplan models show llama-3-70b · ndplan models show ./config.json --seq-len 4096 --json
    """
    recorder = AssumptionRecorder(strict=strict)
    resolved = resolve_model(state(ctx).components(), name_or_path, recorder)
    # `ndplan models --json show X`: the group's --json asks for the same.
    as_json = as_json or bool(ctx.parent is not None and ctx.parent.params.get("as_json"))
    if as_json:
        print_json(model_report(resolved, seq_len, recorder))
    else:
        _render(resolved, seq_len)
    if recorder.line():
        note(recorder.line())


def model_report(
    resolved: ResolvedModel, seq_len: int | None, recorder: AssumptionRecorder
) -> dict[str, Any]:
    """Everything ``models show`` prints, as plain JSON-ready values."""
    spec = resolved.spec
    params = count_parameters(spec)
    report: dict[str, Any] = {
        "id": resolved.preset_id,
        "path": str(resolved.path) if resolved.path is not None else None,
        "name": spec.name,
        "model_type": spec.model_type,
        "source": spec.source,
        "hidden_size": spec.hidden_size,
        "vocab_size": spec.vocab_size,
        "num_layers": spec.num_layers,
        "num_mtp_layers": spec.num_mtp_layers,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "position_embedding": spec.position_embedding,
        "layer_kinds": [_kind_entry(kind, count, spec) for kind, count in spec.kind_counts()],
        "layer_order": [[name, n] for name, n in _runs(_kind_names(spec))],
        "parameters": dict(params.parts),
        "total_parameters": params.total_parameters,
        "active_parameters": params.active_parameters,
        "mtp_parameters": params.mtp_parameters,
    }
    if spec.mtp_kind is not None:
        report["mtp_kind"] = _kind_entry(spec.mtp_kind, spec.num_mtp_layers, spec)
    if spec.vision is not None:
        report["vision"] = spec.vision.model_dump(mode="json")
    if seq_len is not None:
        causal = count_flops(spec, seq_len, "causal")
        full = count_flops(spec, seq_len, "full")
        report.update(
            seq_len=seq_len,
            forward_flops_per_token=causal.forward_flops_per_token,
            training_flops_per_token=causal.training_flops_per_token,
            training_flops_per_token_full_attention=full.training_flops_per_token,
            flops={"causal": causal.model_dump(), "full": full.model_dump()},
        )
    report["assumptions"] = [
        {"field": a.field, "value": a.value, "reader": a.reader} for a in recorder.items
    ]
    return report


def _kind_entry(kind: LayerKind, count: int, spec: ModelSpec) -> dict[str, Any]:
    p = kind_parameters(kind, spec.hidden_size)
    top_k = kind.ffn.top_k if isinstance(kind.ffn, MoEFFN) else 0
    return {
        "name": kind.name,
        "count": count,
        "parameters_per_layer": p.total,
        "active_parameters_per_layer": p.active(top_k),
        **kind.model_dump(mode="json", exclude={"name"}),
    }


# ----------------------------------------------------------------------------- render


def _render(resolved: ResolvedModel, seq_len: int | None) -> None:
    spec = resolved.spec
    params = count_parameters(spec)
    where = (
        f"preset {resolved.preset_id}"
        if resolved.preset_id
        else f"{resolved.path} (read by {resolved.reader})"
    )
    lines = [
        f"{spec.name}  [{where}; model_type {spec.model_type}]",
        f"hidden {spec.hidden_size} · vocab {spec.vocab_size} · {spec.num_layers} decoder layers"
        + (f" + {spec.num_mtp_layers} MTP" if spec.num_mtp_layers else "")
        + f" · positions {spec.position_embedding}"
        + f" · embeddings {'tied' if spec.tie_word_embeddings else 'untied'}",
        f"layer order: {_order_text(_kind_names(spec))}",
    ]
    if spec.source and spec.source != str(resolved.path):
        lines.insert(1, f"source: {spec.source}")
    if spec.vision is not None:
        v = spec.vision
        lines.append(
            f"vision tower: {v.num_layers} layers × {v.hidden_size} wide, {v.num_heads} heads "
            f"(≈ {v.parameters:,} parameters, planned on the first stage)"
        )
    for line in lines:
        stdout.print(line, markup=False, soft_wrap=True)
    stdout.print(_kinds_table(spec))
    stdout.print(_parameters_table(params))
    if seq_len is not None:
        stdout.print(_flops_table(count_flops(spec, seq_len), count_flops(spec, seq_len, "full")))


def _kinds_table(spec: ModelSpec):
    kinds = list(spec.kind_counts())
    if spec.mtp_kind is not None and spec.num_mtp_layers:
        kinds.append((spec.mtp_kind, spec.num_mtp_layers))
    rows = []
    for kind, count in kinds:
        p = kind_parameters(kind, spec.hidden_size)
        rows.append(
            (
                kind.name,
                count,
                _attention_text(kind.attention),
                _ffn_text(kind.ffn),
                f"{kind.norms_per_layer}× {kind.norm}{' +bias' if kind.norm_bias else ''}",
                f"{p.total:,}",
            )
        )
    return table(
        "layer kinds",
        ["kind", ("layers", "right"), "attention", "FFN", "norms", ("params/layer", "right")],
        rows,
    )


def _parameters_table(params: ParameterCount):
    total = params.total_parameters
    rows: list[tuple[str, str, str]] = [
        (PART_LABELS.get(part, part), f"{n:,}", _share(n, total))
        for part, n in params.parts.items()
    ]
    if "output_head" not in params.parts:
        rows.append(("output head", "tied to embedding", ""))
    rows.append(("total", f"{total:,}", "100.00%"))
    if params.active_parameters != total:
        rows.append(
            (
                "active per token",
                f"{params.active_parameters:,}",
                _share(params.active_parameters, total),
            )
        )
    if params.mtp_parameters:
        rows.append(("MTP module (not in total)", f"{params.mtp_parameters:,}", ""))
    return table("parameters", ["part", ("parameters", "right"), ("share", "right")], rows)


def _flops_table(causal: FlopCount, full: FlopCount):
    rows = [
        (FLOP_LABELS.get(part, part), _gflop(value), _gflop(full.forward_parts[part]))
        for part, value in causal.forward_parts.items()
        if value or full.forward_parts[part]
    ]
    rows.append(
        ("forward", _gflop(causal.forward_flops_per_token), _gflop(full.forward_flops_per_token))
    )
    rows.append(
        (
            "training (3× forward)",
            _gflop(causal.training_flops_per_token),
            _gflop(full.training_flops_per_token),
        )
    )
    if causal.mtp_forward_flops_per_token:
        rows.append(
            (
                "MTP forward (not in total)",
                _gflop(causal.mtp_forward_flops_per_token),
                _gflop(full.mtp_forward_flops_per_token),
            )
        )
    return table(
        f"GFLOP per token, seq len {causal.seq_len} (model FLOPs)",
        ["part", ("causal", "right"), ("full attention", "right")],
        rows,
    )


def _attention_text(att: StandardAttention | LatentAttention | LinearAttention) -> str:
    if isinstance(att, StandardAttention):
        a, g = att.num_heads, att.num_kv_heads
        label = "MHA" if g == a else "MQA" if g == 1 else "GQA"
        text = f"{label} {a}×{att.head_dim}" + (f", {g} kv heads" if label == "GQA" else "")
        flags = [
            "qkv bias" if att.qkv_bias else "",
            "out bias" if att.out_bias else "",
            "qk-norm" if att.qk_norm else "",
            "output gate" if att.output_gate else "",
            "sinks" if att.sinks else "",
            f"window {att.sliding_window}" if att.sliding_window else "",
        ]
    elif isinstance(att, LatentAttention):
        text = (
            f"MLA {att.num_heads} heads, q rank {att.q_lora_rank or '-'}, "
            f"kv rank {att.kv_lora_rank}, qk {att.qk_nope_head_dim}+{att.qk_rope_head_dim}, "
            f"v {att.v_head_dim}"
        )
        flags = []
    else:
        text = (
            f"gated delta-net k {att.num_key_heads}×{att.key_head_dim}, "
            f"v {att.num_value_heads}×{att.value_head_dim}, conv {att.conv_kernel_dim}"
        )
        flags = []
    return ", ".join([text, *(f for f in flags if f)])


def _ffn_text(ffn: DenseFFN | MoEFFN) -> str:
    if isinstance(ffn, DenseFFN):
        gated = "gated" if ffn.gated else "ungated"
        return f"dense {ffn.intermediate_size}, {gated} {ffn.activation}" + (
            ", bias" if ffn.bias else ""
        )
    text = f"MoE {ffn.num_experts}×{ffn.expert_intermediate_size}, top-{ffn.top_k}"
    groups, per_token = ffn.routing_group_limit
    if per_token < groups:
        text += f" from {per_token} of {groups} groups"
    if ffn.shared_intermediate_size:
        text += f", shared {ffn.num_shared_experts} ({ffn.shared_intermediate_size} wide"
        text += ", gated)" if ffn.shared_expert_gate else ")"
    text += f", {'gated' if ffn.gated else 'ungated'} {ffn.activation}"
    return text


def _kind_names(spec: ModelSpec) -> list[str]:
    return [spec.kinds[i].name for i in spec.layers]


def _runs(names: list[str]) -> list[tuple[str, int]]:
    """Run-length encoding, in model order."""
    runs: list[tuple[str, int]] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    return runs


def _runs_text(names: list[str]) -> str:
    return ", ".join(name if n == 1 else f"{name} ×{n}" for name, n in _runs(names))


def _order_text(names: list[str]) -> str:
    """Model order, folding a repeating pattern: '(linear+moe ×3, attn+moe) ×12'."""
    n = len(names)
    for period in range(2, n // 2 + 1):
        if all(names[i] == names[i % period] for i in range(n)):
            pattern = names[:period]
            if len(set(pattern)) == 1:
                break
            reps, rest = divmod(n, period)
            text = f"({_runs_text(pattern)}) ×{reps}"
            return text + (f", {_runs_text(names[:rest])}" if rest else "")
    return _runs_text(names)


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.2f}%" if total else ""


def _gflop(flops: float) -> str:
    return f"{flops / 1e9:,.2f}"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="models")
