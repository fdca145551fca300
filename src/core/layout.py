"""A parallel layout (one candidate) and the search space it is drawn from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from .base import Degree, Frozen, NonNegativeInt, PositiveInt
from .errors import InvalidInputError


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


Schedule = Literal["1f1b", "interleaved", "gpipe", "dualpipev"]
RecomputePolicy = Literal["none", "selective", "full", "auto", "stated"]
"""``auto``: each layer's option chosen by the per-stage knapsack; ``stated``: the fastest
setting that fits among those the framework's config states (core.recompute)."""
DIMENSIONS = ("DP", "TP", "PP", "CP", "EP", "VPP", "MBS", "ZERO", "SP", "RECOMPUTE", "OFFLOAD")


def layout_label(values: Mapping[str, Any]) -> str:
    """The degrees in one short line (``tp4 pp8×4 cp2 dp2 mbs1 z1``) for tables and notes;
    takes a layout's fields or a search candidate's mapping of them. DualPipeV reads
    ``pp4v``, as the search table writes it: its two chunks per stage are no VPP."""
    vpp = values.get("vpp", 1)
    ep = values.get("ep", 1)
    return (
        f"tp{values['tp']} pp{values['pp']}"
        + (f"×{vpp}" if vpp > 1 else "")
        + ("v" if values.get("schedule") == "dualpipev" else "")
        + f" cp{values['cp']}"
        + (f" ep{ep}" if ep > 1 else "")
        + f" dp{values['dp']} mbs{values['mbs']} z{values['zero']}"
        + (" off" if values.get("offload_optimizer") else "")
    )


_LABEL_TOKEN = re.compile(
    r"(?P<dim>tp|cp|ep|etp|dp|mbs|z)(?P<value>\d+|\?)"
    r"|pp(?P<pp>\d+|\?)(?:[×xX*](?P<vpp>\d+|\?))?(?P<dualpipe>v)?"
    r"|(?P<off>off)"
)
_LABEL_FIELDS = {"z": "zero"}


def parse_layout_label(text: str) -> dict[str, Any] | None:
    """The degrees of a ``layout_label`` line (``tp4 pp8×4 cp2 dp2 mbs1 z1``), so a layout
    ndplan printed can be given back as it reads; None when ``text`` is not one.

    ``×`` may be written ``x`` or ``*``. A degree written ``?`` maps to None and a
    dimension left out is absent: the caller decides what an unstated degree means.
    ``ppN`` alone is one chunk per stage, as the label writes it (``ppN×?`` leaves VPP
    open); ``ppNv`` is DualPipeV."""
    out: dict[str, Any] = {}
    tokens = text.replace(",", " ").split()
    if not tokens:
        return None
    for token in tokens:
        match = _LABEL_TOKEN.fullmatch(token)
        if match is None:
            return None
        if match["off"]:
            fields = {"offload_optimizer": True}
        elif match["dim"]:
            fields = {_LABEL_FIELDS.get(match["dim"], match["dim"]): _degree(match["value"])}
        else:
            vpp = match["vpp"]
            fields = {"pp": _degree(match["pp"]), "vpp": 1 if vpp is None else _degree(vpp)}
            if match["dualpipe"]:
                fields["schedule"] = "dualpipev"
        for name in fields:
            if name in out:
                return None  # a label states each degree once
        out.update(fields)
    return out


def _degree(text: str) -> int | None:
    return None if text == "?" else int(text)


def layers_per_chunk_text(counts: tuple[int, ...] | None) -> str | None:
    """Per-chunk layer counts as ``estimate --layers-per-chunk`` takes them back (None for
    the default split)."""
    return ",".join(map(str, counts)) if counts else None


class Layout(Frozen):
    """One full assignment of degrees and options."""

    dp: Degree = 1
    """Data-parallel replicas."""
    tp: Degree = 1
    """Tensor-parallel degree (Megatron style)."""
    pp: Degree = 1
    """Pipeline stages."""
    vpp: Degree = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B)."""
    cp: Degree = 1
    """Context-parallel degree: the sequence split across devices."""
    ep: Degree = 1
    """Expert-parallel degree: each MoE layer's experts spread over this many devices."""
    etp: Degree | None = None
    """Expert tensor parallel degree; TP when unset."""
    mbs: PositiveInt = 1
    """Micro-batch size (sequences)."""
    num_microbatches: PositiveInt = 1
    zero: int = Field(default=0, ge=0, le=3)
    """0: replicated; 1: optimizer state sharded (distributed optimizer); 2: + gradients; 3: + parameters (FSDP)."""
    sp: bool = False
    """Sequence parallelism with TP."""
    schedule: Schedule = "1f1b"
    recompute: RecomputePolicy = "none"
    offload_optimizer: bool = False
    layers_per_stage: tuple[NonNegativeInt, ...] | None = None
    """Uneven placement: decoder layers per pipeline stage (per chunk, in chunk order, with VPP)."""

    @model_validator(mode="after")
    def _self_consistent(self) -> Layout:
        if self.vpp > 1 and self.schedule not in ("interleaved",):
            raise ValueError(
                f"vpp({self.vpp}) > 1 needs schedule 'interleaved', not '{self.schedule}'"
            )
        if self.schedule == "interleaved" and self.pp == 1:
            if self.vpp > 1:  # the schedule followed from vpp: name what the user gave
                raise ValueError(
                    f"vpp({self.vpp}) > 1 needs pp > 1 (virtual stages split pipeline "
                    "stages into chunks); give pp 2 or more, or vpp 1"
                )
            raise ValueError("schedule 'interleaved' needs pp > 1")
        if self.schedule == "interleaved" and self.vpp == 1:
            raise ValueError("schedule 'interleaved' needs vpp > 1 (with vpp 1 it is plain 1f1b)")
        if self.schedule == "dualpipev" and self.pp == 1:
            raise ValueError("schedule 'dualpipev' needs pp > 1")
        return self

    @classmethod
    def trusted(
        cls,
        dp: int,
        tp: int,
        pp: int,
        vpp: int,
        cp: int,
        ep: int,
        etp: int | None,
        mbs: int,
        num_microbatches: int,
        zero: int,
        sp: bool,
        schedule: Schedule,
        recompute: RecomputePolicy,
        offload_optimizer: bool,
        layers_per_stage: tuple[int, ...] | None,
    ) -> Layout:
        """A layout from values already known valid, every field given: what
        ``model_construct`` builds, without its per-field defaults pass (a quarter of the
        time; the search builds tens of thousands of layouts from its own tuples)."""
        layout = _new_object(cls)
        _set_attribute(
            layout,
            "__dict__",
            {
                "dp": dp,
                "tp": tp,
                "pp": pp,
                "vpp": vpp,
                "cp": cp,
                "ep": ep,
                "etp": etp,
                "mbs": mbs,
                "num_microbatches": num_microbatches,
                "zero": zero,
                "sp": sp,
                "schedule": schedule,
                "recompute": recompute,
                "offload_optimizer": offload_optimizer,
                "layers_per_stage": layers_per_stage,
            },
        )
        _set_attribute(layout, "__pydantic_fields_set__", set(_LAYOUT_FIELDS))
        _set_attribute(layout, "__pydantic_extra__", None)
        _set_attribute(layout, "__pydantic_private__", None)
        return layout

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def sequence_parallel(self) -> bool:
        """SP only means something with TP > 1 (Megatron turns it off at TP = 1)."""
        return self.sp and self.tp > 1

    @property
    def chunks(self) -> int:
        """Model chunks the layers are split into (pp·vpp; 2·pp for DualPipeV)."""
        if self.schedule == "dualpipev":
            return 2 * self.pp
        return self.pp * self.vpp

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def label(self) -> str:
        return layout_label(self.model_dump())

    @property
    def shape(self) -> tuple[int, int, int, int, int, int]:
        """The device grid (tp, pp, cp, dp, ep, expert tp); layouts of one shape differ
        only in VPP, micro-batch, ZeRO, offload, recompute or layer split."""
        return (self.tp, self.pp, self.cp, self.dp, self.ep, self.expert_tp)

    @property
    def expert_data_parallel(self) -> int:
        """Replicas of each expert: the DP×CP×TP devices of a stage over EP×ETP."""
        return max(1, self.dp * self.cp * self.tp // (self.ep * self.expert_tp))

    def degrees(self) -> tuple[int, ...]:
        """A fixed order of the degrees, used as the ranking's final tie-break."""
        return (
            self.tp,
            self.pp,
            self.cp,
            self.ep,
            self.expert_tp,
            self.vpp,
            self.dp,
            self.mbs,
            self.zero,
            int(self.sp),
            int(self.offload_optimizer),
        )


_LAYOUT_FIELDS = frozenset(Layout.model_fields)
_new_object = object.__new__
_set_attribute = object.__setattr__  # a frozen model refuses its own __setattr__


def dense_etp_error(etp: str) -> InvalidInputError:
    """An expert TP degree on a model without experts: it shards nothing, so it would be
    shown and never used (``estimate``'s layout and ``search``'s space say the same)."""
    return InvalidInputError(f"etp({etp}) is set but the model has no experts; drop --etp")


def selective_not_offered(framework: str) -> str:
    """A framework without per-op recompute: --recompute selective would recompute
    nothing while claiming to."""
    return (
        f"recompute 'selective' is not offered by {framework} (it recomputes whole layers "
        "or nothing); use full, none, auto or stated"
    )


def free_etp(tp: int, ep: int, dp_cp: int) -> int:
    """Expert TP where the space leaves it free: TP's own (Megatron's default) or, where EP
    spans into the TP group (``ep`` beyond ``dp_cp``, as the spec carves EP out of
    dp·cp·tp), the largest divisor of TP that leaves EP room: the experts fold over the TP
    ranks (expert TP 1 at full span), as NVIDIA's Qwen3 recipes run TP 2 with ETP 1.
    Other values are the user's to list (``--etp``): each doubles the MoE layouts. An EP
    that does not divide the group keeps TP's (the group rule refuses it)."""
    group = dp_cp * tp
    fits = [d for d in range(1, tp + 1) if tp % d == 0 and group % (ep * d) == 0]
    return max(fits) if fits else tp


def heads_split(heads: int, kv_heads: int, ways: int) -> bool:
    """Whether ``ways`` ranks can share the attention heads: each takes whole query heads,
    and the key/value heads divide among them or are replicated to them (GQA)."""
    return heads % ways == 0 and (kv_heads % ways == 0 or ways % kv_heads == 0)


def check_layout(
    layout: Layout,
    *,
    num_devices: int,
    global_batch: int,
    seq_len: int,
    num_layers: int,
    heads: int,
    kv_heads: int,
    num_experts: int | None = None,
) -> None:
    """Cross-object checks; each error prints the arithmetic and names the fix."""
    lay = layout
    if lay.devices != num_devices:
        raise InvalidInputError(
            f"tp({lay.tp})·pp({lay.pp})·cp({lay.cp})·dp({lay.dp}) = {lay.devices} ≠ devices({num_devices}); "
            "change a degree or --devices"
        )
    if lay.dp * lay.mbs * lay.num_microbatches != global_batch:
        raise InvalidInputError(
            f"dp({lay.dp})·mbs({lay.mbs})·microbatches({lay.num_microbatches}) = "
            f"{lay.dp * lay.mbs * lay.num_microbatches} ≠ global batch({global_batch}); "
            "change --mbs or --gbs"
        )
    if lay.schedule == "dualpipev" and lay.num_microbatches < 2 * lay.pp:
        # DualPipeV's step asserts num_chunks >= 2·num_ranks: the V needs every stage's
        # two chunks busy before the first backward.
        raise InvalidInputError(
            f"schedule 'dualpipev' needs at least 2·pp = {2 * lay.pp} micro-batches, not "
            f"{lay.num_microbatches}; raise --gbs, or lower --mbs or --pp"
        )
    if lay.schedule == "interleaved" and lay.pp > 1 and lay.num_microbatches % lay.pp:
        # Megatron's interleaved schedule runs the micro-batches in groups of pp per
        # virtual stage; the search refuses the same layouts by name.
        raise InvalidInputError(
            f"schedule 'interleaved' needs the micro-batches ({lay.num_microbatches}) to be a "
            f"multiple of pp ({lay.pp}); change --gbs or --mbs, or use --schedule 1f1b"
        )
    if heads % lay.tp:
        raise InvalidInputError(
            f"tp({lay.tp}) does not divide the attention heads({heads}); choose one that "
            f"does: {_listed(divisors(heads))}"
        )
    if kv_heads % lay.tp and lay.tp % kv_heads:
        raise InvalidInputError(
            f"tp({lay.tp}) and the key/value heads({kv_heads}) do not divide one another; "
            "choose one of "
            + _listed([t for t in divisors(heads) if kv_heads % t == 0 or t % kv_heads == 0])
        )
    if lay.cp > 1 and seq_len % (2 * lay.cp):
        # Megatron's load-balanced ring cuts each sequence into 2·cp chunks; the search
        # refuses the same layouts (cp_not_dividing_sequence).
        raise InvalidInputError(
            f"cp({lay.cp}) needs the sequence length({seq_len}) divisible by 2·cp = "
            f"{2 * lay.cp}; choose another cp or --seq-len"
        )
    if lay.layers_per_stage is not None:
        if len(lay.layers_per_stage) != lay.chunks:
            raise InvalidInputError(
                f"layers_per_stage lists {len(lay.layers_per_stage)} entries; the layout has {lay.chunks} chunks"
            )
        if sum(lay.layers_per_stage) != num_layers:
            raise InvalidInputError(
                f"layers_per_stage sums to {sum(lay.layers_per_stage)} ≠ layers({num_layers})"
            )
    elif lay.chunks > num_layers + 2:
        # Up to two chunks more than layers: the first and the last may hold only the
        # embedding and the loss (Megatron's account-for-embedding/loss split).
        raise InvalidInputError(
            f"pp·vpp = {lay.chunks} chunks exceed the {num_layers} layers plus the embedding "
            "and the loss; lower pp or vpp"
        )
    if num_experts is not None:
        if num_experts % lay.ep:
            raise InvalidInputError(
                f"ep({lay.ep}) does not divide the routed experts({num_experts}); choose one "
                f"that does: {_listed(divisors(num_experts))}"
            )
        group = lay.dp * lay.cp * lay.tp
        if group % (lay.ep * lay.expert_tp):
            raise InvalidInputError(
                f"ep({lay.ep})·etp({lay.expert_tp}) = {lay.ep * lay.expert_tp} does not divide "
                f"dp·cp·tp = {group}; experts are carved out of the data-parallel devices"
                + _etp_fix(lay, group)
            )
    elif lay.ep > 1:
        raise InvalidInputError(f"ep({lay.ep}) > 1 but the model has no experts; use --ep 1")
    elif lay.etp is not None and lay.etp != lay.tp:
        # Without experts an expert TP degree shards nothing; it would be shown, not used.
        raise dense_etp_error(str(lay.etp))
    if lay.zero == 3 and lay.offload_optimizer and lay.pp > 1:
        pass  # allowed: FSDP with offload on a pipeline (rare, but priced)


class SearchSpace(Frozen):
    """Which dimensions vary: per dimension None (free), a tuple of candidates, or one value."""

    tp: tuple[PositiveInt, ...] | None = None
    pp: tuple[PositiveInt, ...] | None = None
    cp: tuple[PositiveInt, ...] | None = None
    dp: tuple[PositiveInt, ...] | None = None
    ep: tuple[PositiveInt, ...] | None = None
    etp: tuple[PositiveInt, ...] | None = None
    vpp: tuple[PositiveInt, ...] | None = None
    mbs: tuple[PositiveInt, ...] | None = None
    zero: tuple[Annotated[int, Field(ge=0, le=3)], ...] | None = None
    sp: tuple[bool, ...] | None = None
    recompute: tuple[RecomputePolicy, ...] | None = None
    offload_optimizer: tuple[bool, ...] | None = None
    schedule: tuple[Schedule, ...] | None = None
    max_tp: PositiveInt | None = None
    """Upper bound on TP; the scale-up domain when unset."""
    balance_layers: bool = True
    """Where the framework places layers unevenly, also try each pipeline with the last
    stage lighter by the output layer's work (``context.balanced_split``)."""
    allow_tp_beyond_scale_up: bool = False
    """Let TP span more than the scale-up domain (--max-tp, or this, lifts the bound).
    The memory budget is the pricing context's (``PricingOptions.max_mem_gib``)."""


def _etp_fix(lay: Layout, group: int) -> str:
    """The fix for an EP·ETP that does not fit: the widest expert TP that does, when
    the expert TP was left to follow TP (a stated one is the user's to change)."""
    if lay.etp is not None or group % lay.ep:
        return ""
    fitting = [etp for etp in range(lay.expert_tp, 0, -1) if group % (lay.ep * etp) == 0]
    return f"; give --etp {fitting[0]} (expert TP follows tp={lay.tp} unless stated)"


def _listed(values: list[int], most: int = 12) -> str:
    """Choices for an error line, the first ``most`` of a long list."""
    shown = ", ".join(map(str, values[:most]))
    return shown + (", …" if len(values) > most else "")
