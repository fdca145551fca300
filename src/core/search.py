"""The search: every layout, refused by cheap rules, priced, bounded, ranked (spec/search.md).

Order of work:
1. the loop nest over divisors, each refusal counted under a named reason;
2. a cheap lower bound on the step time orders every candidate; in that order it gets
   the cost model's own floor from the same fastest layers (with the optimizer step,
   the fixed overhead and the traffic no stage hides), and in the order of that, memory
   with every layer fully recomputed (the lightest option): over the budget → dropped;
   and the exact bound (every layer at its fastest option, plus the least recompute
   time that saves what that overflows);
3. candidates sorted by bound; priced (recompute knapsack per stage, then the time
   model) in batches, stopping once the K-th best beats the next bound — the rest are
   ``bounded``. Batches are decided by the bounds alone, so the set of priced
   candidates does not depend on the executor or its worker count;
4. ranked by step time, then peak memory, then a fixed order of the degrees.

Pricing goes through the Executor port with plain items (positions and tuples of
degrees); workers rebuild their pricing state from a plain recipe.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

from .context import (
    LayerSplits,
    PricingContext,
    default_split,
    head_counted_split,
    mtp_room,
    mtp_room_splits_evenly,
)
from .errors import InfeasibleError, InvalidInputError
from .layout import (
    Layout,
    SearchSpace,
    dense_etp_error,
    divisors,
    free_etp,
    heads_split,
    layers_per_chunk_text,
    selective_not_offered,
)
from .model import MoEFFN
from .plan import PhaseTimes, Plan, SearchResult, SearchSummary
from .ports import Executor, RefusalRule
from .pricing import Pricer
from .recompute import activation_offload_offered
from .units import GiB

SCHEDULES = ("1f1b", "interleaved", "gpipe", "dualpipev")
SCHEDULE_CODES = {name: code for code, name in enumerate(SCHEDULES)}
RECOMPUTES = ("none", "selective", "full", "auto", "stated")
BATCH = 16
"""At most this many candidates priced per batch between bound checks (larger without
bounding, where the batches cannot change what is priced). Small, because a search's top K
is usually settled a few dozen candidates in: batches of 64 priced 128 candidates where 48
settle it (Llama-3-70B on 1,024 H100); the pool gains little on so few anyway."""
SCREEN_BATCH = 64
"""At most this many candidates get their step floor, or their memory and exact bound, per
batch."""
FLOORED_KEPT = 4096
"""Layouts kept from the step floor for the screen (a few MB)."""
QUICK_CHUNK = 32768
"""Candidates given their quick bound between progress reports (DeepSeek-V3 on 2,048
devices has 670,000, about 3 s of bounds before the first one is priced)."""

# Candidate tuple layout (plain, picklable, hashable).
FIELDS = (
    "tp",
    "pp",
    "cp",
    "dp",
    "ep",
    "etp",
    "vpp",
    "mbs",
    "num_microbatches",
    "zero",
    "sp",
    "offload_optimizer",
    "recompute",
    "schedule",
    "split",
)
Candidate = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int]
SPLITS = ("even", "embedding+loss as layers", "balanced")
"""How decoder layers split over chunks: evenly (the remainder to middle chunks); with the
embedding and the loss each counted as one layer (Megatron's account-for-embedding/loss:
the first and last chunks take one layer fewer), which splits 126 layers into 32 chunks, or
into 128 with the first and last holding no decoder layer; or balanced, the last stage
lighter by the output layer's work (``context.balanced_split``)."""


def candidate_layout(c: Candidate, splits: LayerSplits | None = None) -> Layout:
    """A Layout from a candidate tuple, without re-validating (the loop nest only builds valid
    ones). ``splits`` is needed only for candidates with an uneven split."""
    tp, pp, cp, dp, ep, etp, vpp, mbs, m, zero, sp, offload, rec, sched, split = c
    return Layout.trusted(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        ep=ep,
        etp=etp,
        mbs=mbs,
        num_microbatches=m,
        zero=zero,
        sp=bool(sp),
        schedule=SCHEDULES[sched],
        recompute=RECOMPUTES[rec],
        offload_optimizer=bool(offload),
        layers_per_stage=split_counts(splits, c) if split else None,
    )


def split_counts(splits: LayerSplits, c: Candidate) -> tuple[int, ...] | None:
    """A candidate's layers per chunk (its balanced split weighs the head at its degrees)."""
    tp, pp, cp, _dp, ep, etp, vpp, mbs, m, _zero, _sp, _offload, rec, sched, split = c
    if split != 2:
        chunks = 2 * pp if SCHEDULES[sched] == "dualpipev" else pp * vpp
        return splits.counts(pp, chunks, split)
    return splits.balanced(tp, cp, ep, etp, mbs, pp, m, vpp, SCHEDULES[sched], RECOMPUTES[rec])


def uneven_split_text(ctx: PricingContext, c: Candidate) -> str | None:
    """A candidate's layers per chunk as ``estimate --layers-per-chunk`` takes them, when
    the chunks hold different numbers (the default split too: 61 layers over 16 chunks);
    None for an even split."""
    counts = split_counts(ctx.layer_splits, c)
    if counts is None:
        _tp, pp, _cp, _dp, _ep, _etp, vpp, *_rest, sched, _split = c
        chunks = 2 * pp if SCHEDULES[sched] == "dualpipev" else pp * vpp
        counts = default_split(ctx.model.num_layers, chunks, ctx.model.num_mtp_layers)
    return layers_per_chunk_text(counts) if len(set(counts)) > 1 else None


def shape_of(c: Candidate) -> tuple[int, int, int, int, int, int]:
    """A candidate's device grid: tp, pp, cp, dp, ep, etp."""
    return c[:6]


def layout_of(c: Candidate) -> tuple[int, ...]:
    """A candidate without its layer split: the layout a user configures. Its splits are
    ways to place that layout's layers, chosen per layout as its recompute is, so the
    ranking holds each layout once, at its fastest split."""
    return c[:-1]  # the split is a candidate's last field (FIELDS)


def candidate_dict(c: Candidate) -> dict[str, Any]:
    d = dict(zip(FIELDS, c, strict=True))
    d["sp"] = bool(d["sp"])
    d["offload_optimizer"] = bool(d["offload_optimizer"])
    d["recompute"] = RECOMPUTES[d["recompute"]]
    d["schedule"] = SCHEDULES[d["schedule"]]
    d["split"] = SPLITS[d["split"]]
    return d


def candidate_text(candidate: Mapping[str, Any]) -> str:
    """``tp=2 pp=4 … schedule=1f1b``: a candidate's fields as error and debug lines show them."""
    return " ".join(f"{key}={value}" for key, value in candidate.items())


def balanced_policies(
    splits: LayerSplits,
    recomputes: Sequence[int],
    tp: int,
    cp: int,
    ep: int,
    etp: int,
    mbs: int,
    pp: int,
    m: int,
    vpp: int,
    sched: str,
    split: int,
) -> list[int]:
    """The recompute policies under which the balanced split, its head weighed at these
    degrees (``LayerSplits.head_weight``), exists and differs from the ``split`` a
    pipeline already has."""
    own = splits.counts(pp, pp * vpp, split)
    differ = []
    for rec in recomputes:
        counts = splits.balanced(tp, cp, ep, etp, mbs, pp, m, vpp, sched, RECOMPUTES[rec])
        if counts is not None and counts != own:
            differ.append(rec)
    return differ


def tie_key(c: Candidate) -> tuple[int, ...]:
    """The fixed order of degrees that breaks ranking ties."""
    tp, pp, cp, dp, ep, etp, vpp, mbs, _m, zero, sp, offload, rec, sched, split = c
    return (tp, pp, cp, ep, etp, vpp, dp, mbs, zero, sp, offload, rec, sched, split)


# ----------------------------------------------------------------------------- enumeration


@dataclass
class Enumeration:
    candidates: list[Candidate]
    refusals: list[tuple[dict[str, Any], str]]
    refused: Counter = field(default_factory=Counter)
    generated: int = 0
    batch_ok: int = 0
    """(tp, pp, cp, dp) combinations whose dp divides the global batch."""
    batch_dps: set[int] = field(default_factory=set)
    """Data-parallel degrees that reached the batch check (past the tp/pp/cp rules)."""
    reached: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    """Micro-batch sizes, VPP depths and schedules some layout could take (whatever a rule
    then said): a fixed value never reached is one no layout of the problem can have."""
    admitted: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    """TP, PP, CP and DP degrees the device count admits beside the listed others (whatever
    a rule then said)."""

    def never_tried(self, space: SearchSpace) -> dict[str, tuple]:
        """Per dimension, the listed values no layout of the problem can take (tp 3 on 8
        devices, a micro-batch size that divides no replica's batch): never generated,
        so neither refused nor priced."""
        out = {}
        for name in ("tp", "pp", "cp", "dp", "vpp", "mbs"):
            values = getattr(space, name)
            seen = self.admitted[name] if name in ("tp", "pp", "cp", "dp") else self.reached[name]
            missing = tuple(sorted(set(values or ()) - seen))
            if missing:
                out[name] = missing
        return out


@dataclass(frozen=True)
class SearchSettings:
    """What varies and how the search prices and prunes."""

    space: SearchSpace
    top_k: int = 10
    bounding: bool = True
    distinct: bool = False
    """Keep only the fastest layout of each shape (``shape_of``) in the top K: the
    layouts of one shape differ only in VPP, micro-batch, ZeRO, offload, recompute or
    layer split, and can fill a top K that a user reads for alternatives."""
    rank_through_s: float | None = None
    """Also price every layout whose bound is at most this many seconds (a baseline's
    step time), so the ranking holds every layout faster than it and its rank is exact."""


def _allowed(values: tuple | None, value) -> bool:
    return values is None or value in values


def enumerate_candidates(
    ctx: PricingContext,
    space: SearchSpace,
    rules: Sequence[tuple[str, RefusalRule]] = (),
    record: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> Enumeration:
    """The loop nest over divisors (no invalid product is ever generated); ``progress``
    hears, as each tp starts, how many of the (tp, pp) pairs are done."""
    model, fw, job = ctx.model, ctx.framework, ctx.job
    n = ctx.cluster.num_devices
    gbs, seq = job.global_batch_size, job.seq_length
    heads, kv_heads = model.head_count_for_tp
    num_layers = model.num_layers
    splits = ctx.layer_splits
    experts = next((k.ffn.num_experts for k in model.kinds if isinstance(k.ffn, MoEFFN)), None)
    expert_width = next(
        (k.ffn.expert_intermediate_size for k in model.kinds if isinstance(k.ffn, MoEFFN)), None
    )
    dense_widths = [k.ffn.intermediate_size for k in model.kinds if not isinstance(k.ffn, MoEFFN)]
    max_tp = space.max_tp or (n if space.allow_tp_beyond_scale_up else ctx.cluster.scale_up_domain)
    out = Enumeration([], [])
    keep = out.candidates.append

    def refuse(reason: str, **degrees: Any) -> None:
        out.generated += 1
        out.refused[reason] += 1
        if record:
            out.refusals.append((degrees, reason))

    zeros = [z for z in fw.zero_stages if _allowed(space.zero, z)]
    lacking = [z for z in space.zero or () if z not in fw.zero_stages]
    # The stage that stands for all of them where there is one replica to shard over.
    single_zero = fw.default_zero if fw.default_zero in zeros else (zeros[0] if zeros else 0)
    if not zeros or lacking:
        # Fix: a ZeRO stage the framework lacks refused nothing by name and ended in
        # "no layout survived the refusal rules" (exit 1); it is invalid input, as in estimate.
        # One of several listed was dropped without a word; it is refused the same way.
        raise InvalidInputError(
            f"zero({'|'.join(map(str, lacking or space.zero or ()))}) is not offered by {fw.name} "
            f"(offers {', '.join(map(str, fw.zero_stages))})"
        )
    only_tp = space.tp is not None and all(t > 1 for t in space.tp)
    if only_tp and not any(_allowed(space.sp, v) for v in fw.sequence_parallel):
        # As for ZeRO: an SP setting the framework lacks is invalid input, as in estimate.
        raise InvalidInputError(
            fw.sp_not_offered(
                "|".join("on" if v else "off" for v in space.sp or ()),
                "|".join(map(str, space.tp)),
            )
        )
    if experts is None:  # expert degrees shard nothing in a dense model: as estimate refuses
        if space.ep is not None and set(space.ep) != {1}:
            raise InvalidInputError(
                f"ep({'|'.join(map(str, space.ep))}) but the model has no experts; use --ep 1"
            )
        if space.etp is not None:
            raise dense_etp_error("|".join(map(str, space.etp)))
    if "selective" in (space.recompute or ()) and not fw.selective:
        raise InvalidInputError(selective_not_offered(fw.name))
    # As the candidate tuple holds them (0/1), so the innermost loop converts nothing.
    offloads = [int(o) for o in (False, True) if _allowed(space.offload_optimizer, o)]
    recomputes = [RECOMPUTES.index(r) for r in (space.recompute or ("auto",))]
    schedules_allowed = space.schedule
    if schedules_allowed == ("interleaved",) and space.vpp is not None and max(space.vpp) < 2:
        raise InvalidInputError(
            "schedule 'interleaved' needs vpp ≥ 2 (virtual stages per device); drop --vpp 1 "
            "or use --schedule 1f1b"
        )
    if schedules_allowed is not None and not set(schedules_allowed) & set(fw.schedules):
        # As for ZeRO: a schedule the framework lacks is invalid input, as in estimate.
        # (A library caller may list every schedule and get the ones this framework has;
        # the CLI refuses each one the user names that it lacks.)
        raise InvalidInputError(
            f"schedule({'|'.join(schedules_allowed)}) is not offered by {fw.name} "
            f"(offers {', '.join(fw.schedules)})"
        )
    tps = divisors(n)
    pps_of = [divisors(n // tp) for tp in tps]
    pairs = sum(map(len, pps_of))
    pairs_done = 0
    for tp, pps in zip(tps, pps_of, strict=True):
        if progress is not None:
            progress("enumerate", pairs_done, pairs)
        pairs_done += len(pps)
        out.admitted["tp"].add(tp)
        if not _allowed(space.tp, tp):
            continue
        if tp > max_tp:
            # Named for the bound that refused it: the user's --max-tp, or the domain.
            refuse("tp_above_max_tp" if space.max_tp else "tp_beyond_scale_up_domain", tp=tp)
            continue
        if not heads_split(heads, kv_heads, tp):
            refuse("tp_not_dividing_heads", tp=tp)
            continue
        if any(w % tp for w in dense_widths):
            refuse("tp_not_dividing_ffn", tp=tp)
            continue
        for pp in pps:
            out.admitted["pp"].add(pp)
            if not _allowed(space.pp, pp):
                continue
            if pp > num_layers:
                refuse("pp_exceeds_layers", tp=tp, pp=pp)
                continue
            for cp in divisors(n // (tp * pp)):
                out.admitted["cp"].add(cp)
                if not _allowed(space.cp, cp):
                    continue
                if seq % (2 * cp) and cp > 1:
                    refuse("cp_not_dividing_sequence", tp=tp, pp=pp, cp=cp)
                    continue
                ulysses = cp > 1 and ctx.settings.cp_kind == "all_to_all"  # read only if used
                if ulysses and not heads_split(heads, kv_heads, tp * cp):
                    # All-to-all CP hands each rank whole heads: tp·cp of them at least.
                    refuse("cp_all_to_all_exceeds_heads", tp=tp, pp=pp, cp=cp)
                    continue
                dp = n // (tp * pp * cp)
                out.admitted["dp"].add(dp)
                if not _allowed(space.dp, dp):
                    continue
                out.batch_dps.add(dp)
                if gbs % dp:
                    refuse("batch_not_divisible_by_dp", tp=tp, pp=pp, cp=cp, dp=dp)
                    continue
                out.batch_ok += 1
                eps = [1]
                if experts is not None:
                    group = dp * cp * (tp if fw.expert_tp else 1)
                    if space.ep is None:
                        eps = [e for e in divisors(group) if experts % e == 0]
                    else:  # fixed degrees that cannot work are refused by name, not skipped
                        eps = []
                        for e in sorted(set(space.ep)):
                            if experts % e:
                                refuse("ep_not_dividing_experts", tp=tp, pp=pp, cp=cp, ep=e)
                            elif group % e:
                                refuse("ep_not_dividing_expert_group", tp=tp, pp=pp, cp=cp, ep=e)
                            else:
                                eps.append(e)
                # A fixed expert TP is taken as given (estimate prices any), and the group and
                # width rules below judge it; a free one is ``free_etp``'s.
                listed = sorted(set(space.etp)) if space.etp is not None else None
                etps = {ep: listed or [free_etp(tp, ep, dp * cp)] for ep in eps}
                for mbs in divisors(gbs // dp):
                    if not _allowed(space.mbs, mbs):
                        continue
                    out.reached["mbs"].add(mbs)
                    m = gbs // (dp * mbs)
                    for ep in eps:
                        for etp in etps[ep]:
                            if experts is not None and (dp * cp * tp) % (ep * etp):
                                refuse(
                                    "ep_etp_not_dividing_group", tp=tp, pp=pp, cp=cp, ep=ep, etp=etp
                                )
                                continue
                            if expert_width is not None and expert_width % etp:
                                refuse("etp_not_dividing_expert_ffn", etp=etp)
                                continue
                            one_replica = dp * cp == 1 and (
                                experts is None or dp * cp * tp == ep * etp
                            )
                            balanced = (
                                partial(
                                    balanced_policies,
                                    splits,
                                    recomputes,
                                    tp,
                                    cp,
                                    ep,
                                    etp,
                                    mbs,
                                    pp,
                                    m,
                                )
                                if space.balance_layers
                                else None
                            )
                            for vpp, sched, split, recs in _schedules(
                                pp,
                                m,
                                num_layers,
                                fw.schedules,
                                space,
                                schedules_allowed,
                                refuse,
                                fw.uneven_pipeline,
                                model.num_mtp_layers,
                                out.reached,
                                recomputes,
                                balanced,
                            ):
                                for zero in zeros:
                                    if pp > 1 and zero > fw.max_zero_with_pipeline:
                                        refuse("zero_not_with_pipeline", pp=pp, zero=zero)
                                        continue
                                    if fw.fsdp_with_cp and cp > 1 and zero < 3:
                                        refuse("cp_needs_fsdp", cp=cp, zero=zero)
                                        continue
                                    if one_replica and zero != single_zero:
                                        # Sharding over one replica is no sharding: every
                                        # ZeRO stage is the same layout, so rank it once.
                                        continue
                                    sps = [int(v) for v in fw.sequence_parallel] if tp > 1 else [0]
                                    for sp in sps:
                                        if tp > 1 and not _allowed(space.sp, sp):
                                            continue  # (SP means nothing at tp = 1)
                                        if (
                                            tp > 1
                                            and not sp
                                            and fw.name == "megatron"
                                            and experts is not None
                                        ):
                                            refuse("moe_tp_needs_sp", tp=tp, sp=bool(sp))
                                            continue
                                        if sp and cp > 1 and not fw.sp_with_cp:
                                            refuse("sp_not_with_cp", cp=cp, sp=True)
                                            continue
                                        for offload in offloads:
                                            out.generated += len(recs)
                                            for rec in recs:
                                                c = (
                                                    tp,
                                                    pp,
                                                    cp,
                                                    dp,
                                                    ep,
                                                    etp,
                                                    vpp,
                                                    mbs,
                                                    m,
                                                    zero,
                                                    sp,
                                                    offload,
                                                    rec,
                                                    SCHEDULE_CODES[sched],
                                                    split,
                                                )
                                                if rules and _refused_by_rule(
                                                    c, rules, ctx, splits, out, record
                                                ):
                                                    continue
                                                keep(c)
    return out


def _refused_by_rule(
    c: Candidate,
    rules: Sequence[tuple[str, RefusalRule]],
    ctx: PricingContext,
    splits: LayerSplits,
    out: Enumeration,
    record: bool,
) -> bool:
    """Whether a plugged-in refusal rule refuses the candidate (counted under its name;
    recorded with the reason it gave)."""
    for name, rule in rules:
        reason = rule(candidate_layout(c, splits), ctx)
        if reason:
            out.refused[name] += 1
            if record:
                detail = name if reason == name else f"{name}: {reason}"
                out.refusals.append((candidate_dict(c), detail))
            return True
    return False


def _schedules(
    pp: int,
    m: int,
    num_layers: int,
    offered: tuple[str, ...],
    space: SearchSpace,
    allowed: tuple[str, ...] | None,
    refuse: Callable[..., None],
    uneven: bool = True,
    mtp_layers: int = 0,
    seen: dict[str, set] | None = None,
    recomputes: Sequence[int] = (RECOMPUTES.index("auto"),),
    balanced: Callable[[int, str, int], list[int]] | None = None,
) -> Iterable[tuple[int, str, int, Sequence[int]]]:
    """(vpp, schedule, split, recompute policies) for one pipeline depth; ``seen``
    collects the depths and schedules the layers allow, before the micro-batch rules
    refuse any. Where the framework places layers unevenly and ``balanced`` is given
    (``balanced_policies`` at this pipeline's other degrees), each (vpp, schedule) also
    comes with the balanced split, for the policies under which it differs from its own."""

    def with_balanced(
        vpp: int, sched: str, split: int
    ) -> Iterator[tuple[int, str, int, Sequence[int]]]:
        yield vpp, sched, split, recomputes
        if uneven and balanced is not None and sched != "dualpipev":
            differ = balanced(vpp, sched, split)
            if differ:
                yield vpp, sched, 2, differ

    seen = seen if seen is not None else defaultdict(set)
    seen["pp"].add(pp)  # the degrees and the expert rules let a layout get this far
    if pp == 1:
        # No pipeline, no schedule to speak of: it stands as 1F1B, so a space that fixes
        # another schedule (interleaved, DualPipeV) asks for pipelined layouts only.
        if _allowed(space.vpp, 1) and (allowed is None or "1f1b" in allowed):
            seen["vpp"].add(1)
            seen["schedule"].add("1f1b")
            yield 1, "1f1b", 0, recomputes
        return
    for sched in ("1f1b", "gpipe", "dualpipev"):
        if sched in offered and (
            (allowed is not None and sched in allowed) or (allowed is None and sched == "1f1b")
        ):
            if sched == "dualpipev" and num_layers < 2 * pp:
                continue
            if _allowed(space.vpp, 1):
                seen["vpp"].add(1)
                seen["schedule"].add(sched)
            if sched == "dualpipev" and m < 2 * pp:
                # DualPipeV's step asserts num_chunks >= 2·num_ranks.
                refuse("dualpipev_needs_microbatches_at_least_2pp", pp=pp, num_microbatches=m)
                continue
            if _allowed(space.vpp, 1):
                yield from with_balanced(1, sched, 0)
    if "interleaved" not in offered or (allowed is not None and "interleaved" not in allowed):
        return
    offered_vpps = interleaved_vpps(num_layers, pp, mtp_layers, uneven, space.vpp is not None)
    for vpp, split in offered_vpps:
        if not _allowed(space.vpp, vpp):
            continue
        seen["vpp"].add(vpp)
        seen["schedule"].add("interleaved")
        if m % pp:
            refuse(
                "interleaved_needs_microbatches_multiple_of_pp", pp=pp, vpp=vpp, num_microbatches=m
            )
            continue
        yield from with_balanced(vpp, "interleaved", split)


@cache
def interleaved_vpps(
    num_layers: int, pp: int, mtp_layers: int, uneven: bool, listed: bool
) -> tuple[tuple[int, int], ...]:
    """(vpp, split code) for each VPP ≥ 2 whose chunks may split the layers at this
    depth, in order; ``listed``: the user lists VPPs. Cached: the search asks once per
    degree, micro-batch and EP, and the answer depends on the depth alone."""
    # With the embedding and the loss counted as layers, pp·vpp may reach layers + 2: the
    # first and last chunks then hold only the embedding and the loss (NVIDIA's GB200
    # recipe for Llama 3.1 405B runs 126 layers as pp 16 × vpp 8).
    # An MTP model's default split leaves the last chunk room for MTP and the loss (see
    # context.default_split): its chunk counts divide the layers plus that room.
    # Where that room does not divide them, the embedding, the loss and each MTP block
    # may count as a layer instead (NVIDIA's DeepSeek-V3 on H100: pp 8 × vpp 4).
    held = mtp_room(mtp_layers)
    head_counted_slots = num_layers + 2 + mtp_layers
    top = (num_layers + max(2 + mtp_layers, held)) // pp if uneven else num_layers // pp
    even: list[tuple[int, int]] = []
    near_even: list[tuple[int, int]] = []
    for vpp in range(2, top + 1):
        chunks = pp * vpp
        room_splits_evenly = uneven and mtp_room_splits_evenly(num_layers, chunks, mtp_layers)
        if num_layers % chunks == 0 or room_splits_evenly:
            even.append((vpp, 0))
        elif not uneven or not head_counted_split(num_layers, pp, chunks, mtp_layers):
            continue
        elif head_counted_slots % chunks == 0:
            even.append((vpp, 1))
        else:
            near_even.append((vpp, 1))
    # Chunks one slot short on some stages (head_counted_split) are offered where no
    # VPP splits this depth evenly (61 layers split evenly at no pp > 1, so without them
    # DeepSeek-V3 and Kimi K2 could not interleave at all), or where the user lists VPPs.
    # Elsewhere the even VPPs already span interleaving's trade-off, and the near-even ones
    # would add 13 % to Llama 3 70B's layouts at 1,024 devices for no faster layout.
    if listed or not even:
        return tuple(sorted(even + near_even))
    return tuple(even)


def reachable_batches(
    ctx: PricingContext,
    space: SearchSpace,
    near: int,
    count: int = 6,
    dps: Iterable[int] | None = None,
) -> list[int]:
    """Global batch sizes near ``near`` that some data-parallel degree divides.

    ``dps``: the degrees that passed the tp/pp/cp rules (from the enumeration); without
    them a dp reachable only through a refused tp (e.g. beyond the scale-up domain, or
    not dividing the heads) was offered as a fix that cannot work."""
    if dps is None:
        dps = space_dps(ctx.cluster.num_devices, space)
    return _near_multiples(near, sorted(set(dps)), count)


def space_dps(devices: int, space: SearchSpace) -> set[int]:
    """The data-parallel degrees of every tp·pp·cp·dp = ``devices`` that takes only values
    the space allows (the refusal rules aside); empty when the fixed degrees multiply
    out to no layout of ``devices``."""
    return {
        devices // (tp * pp * cp)
        for tp in divisors(devices)
        for pp in divisors(devices // tp)
        for cp in divisors(devices // (tp * pp))
        if _allowed(space.tp, tp)
        and _allowed(space.pp, pp)
        and _allowed(space.cp, cp)
        and _allowed(space.dp, devices // (tp * pp * cp))
    }


def _near_multiples(near: int, dps: list[int], count: int) -> list[int]:
    found: list[int] = []
    # Fix: search far enough to reach a multiple of the largest degree (the window was
    # 4·near, so e.g. gbs 7 with dp 64 listed nothing).
    for delta in range(0, max(4 * near, count * max(dps, default=1)) + 1):
        for value in (near - delta, near + delta):
            if value > 0 and value not in found and any(value % d == 0 for d in dps):
                found.append(value)
        if len(found) >= count:
            break
    return sorted(found)[:count]


# ----------------------------------------------------------------------------- pricing tasks


@dataclass(frozen=True, slots=True)
class Screened:
    """Phase-2 result of one candidate."""

    fits: bool
    bound_s: float
    miss_stage: int
    miss_bytes: int


@dataclass(frozen=True, slots=True)
class Priced:
    """Phase-3 result of one candidate (plus its debug parts when a sink listens)."""

    fits: bool
    step_s: float
    peak_bytes: int
    peak_stage: int
    memory_parts: dict[str, float] | None = None
    time_parts: dict[str, float] | None = None


class SearchPricing:
    """Per-process pricing state: a Pricer and the candidate tasks run on it."""

    def __init__(self, pricer: Pricer, debug: bool = False) -> None:
        self.pricer = pricer
        self.debug = debug
        # Layouts built for the step floor, handed on to the screen (when both
        # run in this process), which would build the same ones again; the oldest go
        # first past FLOORED_KEPT (under a pool, the screen runs elsewhere).
        self._floored: dict[Candidate, Layout] = {}

    def quick_bound(self, c: Candidate) -> float:
        """A cheap lower bound on the step time: every decoder layer at its fastest option,
        stages perfectly balanced, no embedding, head, data-parallel or optimizer time and
        no fixed overhead (the cost model's own, if any, comes with its fixed step
        seconds: the calibration's may not be the one a plugged-in model charges).
        With W one micro-batch through all layers: 1F1B/GPipe ``W·(1 + (m − 1)/pp)``;
        interleaved ``(m − 1/vpp)·W/pp + W/vpp``; DualPipeV ``m·W/pp``.

        Interleaved: the pipeline is ``m·t_max + (S − t_max)/vpp`` with S the stages'
        sum; it grows with t_max (m ≥ 1 ≥ 1/vpp) and with S, and ``S ≥ W``,
        ``t_max ≥ S/pp``. Leaving out the drain term (``m·W/pp``) made the bound so loose
        that most screened layouts were interleaved ones that could never rank."""
        return self.quick_bounds((c,))[0]

    def quick_bounds(self, candidates: Sequence[Candidate]) -> list[float]:
        """``quick_bound`` of each candidate (the search asks for every one it generated:
        tens of thousands)."""
        out = []
        # W on the raw degrees it reads (finer than the layer key, so never wrong): a few
        # hundred of them for tens of thousands of candidates, without building the
        # shared cache's key for each.
        by_degrees: dict[tuple, float] = {}
        for c in candidates:
            tp, pp, cp, _dp, ep, etp, vpp, mbs, m, _zero, sp, _offload, _rec, sched, _ = c
            degrees = (tp, cp, sp, ep, etp, mbs, sched, self._unpaired_share(c))
            w = by_degrees.get(degrees)
            if w is None:
                w = by_degrees[degrees] = self._layers_seconds(c)
            if sched in (0, 2):  # 1f1b, gpipe
                out.append(w * (1 + (m - 1) / pp))
            elif sched == 1:  # interleaved
                out.append((m - 1 / vpp) * w / pp + w / vpp)
            else:
                out.append(m * w / pp)
        return out

    def _layers_seconds(self, c: Candidate) -> float:
        """W: one micro-batch through every decoder layer, each at its fastest option
        (memoised on the layer degrees, which every worker is handed)."""
        ctx = self.pricer.ctx
        key = ("quick", *candidate_layer_key(c), self._unpaired_share(c))
        w = ctx.cache.get(key)
        if w is None:
            layout = candidate_layout(c, ctx.layer_splits)
            cost = self.pricer.cost
            w = 0.0
            for kind, count in ctx.model.kind_counts():
                w += count * sum(cost.layer_seconds(ctx, layout, kind, frozenset()).values())
            ctx.cache[key] = w
        return w

    def _unpaired_share(self, c: Candidate) -> float | None:
        """The candidate's ``PricingContext.unpaired_a2a_share``: a layer's time depends on
        it under the combined 1F1B schedule, so W is memoised with it."""
        _tp, pp, _cp, _dp, ep, _etp, vpp, _mbs, m, _zero, _sp, _offload, _rec, sched, _ = c
        if ep == 1:
            return None
        return self.pricer.ctx.unpaired_share(ep, pp, vpp, SCHEDULES[sched], m)

    def floor_bound(self, c: Candidate, quick: float) -> float:
        """The cost model's own lower bound on the step from the same fastest layers (its
        optional ``step_floor_seconds``: with the optimizer step, the fixed overhead and
        the traffic no such stage hides), where it is above the quick bound; computed
        only for candidates the quick bound could not rule out."""
        floor = getattr(self.pricer.cost, "step_floor_seconds", None)
        if floor is None:
            return quick
        ctx = self.pricer.ctx
        floored = self._floored
        if len(floored) >= FLOORED_KEPT:
            del floored[next(iter(floored))]
        layout = floored[c] = candidate_layout(c, ctx.layer_splits)
        return max(quick, floor(ctx, layout, ctx.placement(layout), self._layers_seconds(c)))

    def screen(self, candidates: Sequence[Candidate]) -> list[Screened]:
        """Memory at full recompute, and the lower bound on time (``auto``: all layers at
        their fastest, plus the least recompute time that saves their overflow)."""
        out = []
        pricer = self.pricer
        floored = self._floored
        for c in candidates:
            layout = floored.pop(c, None) or candidate_layout(c, pricer.ctx.layer_splits)
            miss = pricer.lightest_miss(layout)
            # Fix: the shortcut reports the overflow at full recompute; a fixed policy is
            # priced below as stated, so its overflow (and the closest-miss line) matches
            # `ndplan estimate` of that layout (it reported a mix of the policy's static
            # memory and fully recomputed activations, i.e. no real layout's number).
            # A stated setting is one per-layer choice among those auto weighs, so auto's
            # lightest layout and lower bound hold for it too.
            chosen_per_layer = layout.recompute in ("auto", "stated")
            if miss is not None and chosen_per_layer:
                out.append(Screened(False, math.inf, miss.stage, miss.over_bytes))
                continue
            if chosen_per_layer:
                out.append(Screened(True, pricer.auto_lower_bound(layout), -1, 0))
                continue
            priced = pricer.price(layout)
            if not priced.fits:
                # A fixed policy that overflows is over memory as stated.
                over = priced.peak_bytes - pricer.ctx.budget_bytes
                out.append(Screened(False, math.inf, priced.peak_stage, over))
                continue
            out.append(Screened(True, priced.time.step_s, -1, 0))
        return out

    def plans(self, candidates: Sequence[Candidate]) -> list[Plan]:
        """The listed candidates as whole plans (memory and time breakdowns, the recompute
        each layer runs), unranked: where the search's pricing ran, whose caches hold
        their parts (a pool's workers; this process prices them cold)."""
        pricer = self.pricer
        return [
            pricer.plan(pricer.price(candidate_layout(c, pricer.ctx.layer_splits)))
            for c in candidates
        ]

    def price(self, candidates: Sequence[Candidate]) -> list[Priced]:
        out = []
        for c in candidates:
            layout = candidate_layout(c, self.pricer.ctx.layer_splits)
            priced = self.pricer.price(layout)
            mem = tim = None
            if self.debug:
                peak = priced.peak_stage
                mem = {
                    **self.pricer.charged_static_parts(priced, peak),
                    "activations": priced.activations[peak],
                    "stage": peak,
                    "total": priced.peak_bytes,
                }
                tim = {**priced.time.parts, "step": priced.time.step_s}
            out.append(
                Priced(
                    priced.fits, priced.time.step_s, priced.peak_bytes, priced.peak_stage, mem, tim
                )
            )
        return out


def run_phase(
    ctx: PricingContext,
    executor: Executor | None,
    task: Callable | None,
    recipe: Any,
    phase: str,
    items: Sequence[Any],
    local: Callable[[Sequence[Any]], list[Any]],
) -> list[Any]:
    """One phase over all items: in-process, or through the executor, whose task returns
    ``(values, assumptions)`` per chunk; values are concatenated in order and the
    workers' assumptions merged into this process's report."""
    if not items:
        return []
    # Workers keep their own caches, so candidates that share a layer's costs and fronts
    # go out side by side (the executor hands out contiguous chunks); the values come
    # back in the given order, so nothing downstream sees the difference. This process
    # takes them in the same order: a candidate that fails is then the first failing
    # one in that order whatever runs them (an executor raises its earliest chunk's).
    sent = sorted(range(len(items)), key=lambda j: _cache_locality(items[j]))
    values: list[Any] = []
    if executor is None or task is None:
        values = local([items[j] for j in sent])
    else:
        for chunk_values, assumptions in executor.map(
            task, (recipe, phase), [items[j] for j in sent]
        ):
            values.extend(chunk_values)
            ctx.recorder.merge(assumptions)
    if len(values) != len(items):
        raise RuntimeError(f"executor returned {len(values)} results for {len(items)} items")
    ordered: list[Any] = [None] * len(items)
    for j, value in zip(sent, values, strict=True):
        ordered[j] = value
    return ordered


def candidate_layer_key(c: Candidate) -> tuple:
    """``context.layer_key`` of the candidate's layout, from its tuple: the degrees one
    layer's time and recompute options depend on."""
    tp, _pp, cp, _dp, ep, etp, _vpp, mbs, _m, _zero, sp, _offload, _rec, sched, _split = c
    return (tp, cp, bool(sp and tp > 1), ep, etp, mbs, sched == 3)


def _cache_locality(c: Candidate) -> tuple:
    """The degrees a layer's costs and fronts depend on first, then a stage's (pp, vpp,
    schedule, split), then the rest."""
    _tp, pp, _cp, dp, _ep, _etp, vpp, _mbs, m, zero, _sp, offload, rec, sched, split = c
    return (*candidate_layer_key(c), pp, vpp, sched, split, zero, offload, m, dp, rec)


# ----------------------------------------------------------------------------- the search

_collector_lock = threading.Lock()
_collector_holders = 0
_collector_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a search runs, as it was afterwards.

    A search allocates hundreds of thousands of long-lived cache entries (fronts, stage
    seconds, placements) and no reference cycles; the collector's passes over them
    freed nothing and took 10–20 % of the search (scenario (b) of ``make bench``: 10.5 s
    against 8.2 s, the same peak memory). Nested and concurrent searches share one pause;
    the last one out restores the collector's state."""
    global _collector_holders, _collector_was_enabled
    with _collector_lock:
        if _collector_holders == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_holders += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_holders -= 1
            if _collector_holders == 0 and _collector_was_enabled:
                gc.enable()


@dataclass
class SearchHooks:
    """How the search reports progress and debug records (all optional)."""

    progress: Callable[[str, int, int], None] | None = None
    """``(phase, done, total)``: ``enumerate`` by (tp, pp) pairs (of every tp, reported
    as each tp starts), ``bound`` as every candidate gets its quick bound, then
    ``price`` as candidates are examined in bound order (memory, exact bound, price);
    with bounding the search stops once the rest cannot rank, well short of the total."""
    refusal: Callable[[dict[str, Any], str], None] | None = None
    priced: Callable[[dict[str, Any], dict[str, float], dict[str, float]], None] | None = None


@collector_paused()
def search(
    ctx: PricingContext,
    pricing: SearchPricing,
    settings: SearchSettings,
    *,
    rules: Sequence[tuple[str, RefusalRule]] = (),
    executor: Executor | None = None,
    task: Callable | None = None,
    recipe: Any = None,
    hooks: SearchHooks | None = None,
) -> SearchOutcome:
    """Every layout, priced and ranked; raises InfeasibleError when nothing fits."""
    hooks = hooks or SearchHooks()
    t0 = time.perf_counter()
    enum = enumerate_candidates(
        ctx, settings.space, rules, record=hooks.refusal is not None, progress=hooks.progress
    )
    if hooks.refusal is not None:
        for degrees, reason in enum.refusals:
            hooks.refusal(degrees, reason)
    # Fix (tests/unit/test_search.py): the batch is unreachable when no (tp, pp, cp, dp)
    # that reached the batch check passed it. Comparing the batch count with *every*
    # refusal missed this whenever a cheaper rule also fired (e.g. tp 16 beyond the
    # scale-up domain on 16 devices), and such inputs exited 1 ("no layout survived")
    # instead of 3 with the reachable batches.
    if not enum.candidates and enum.refused.get("batch_not_divisible_by_dp") and not enum.batch_ok:
        near = reachable_batches(ctx, settings.space, ctx.job.global_batch_size, dps=enum.batch_dps)
        raise InvalidInputError(
            f"global batch {ctx.job.global_batch_size} cannot be split over {ctx.cluster.num_devices} devices by any "
            f"allowed layout; reachable batches near it: {', '.join(map(str, near))}"
        )
    if enum.generated == 0 or not (
        enum.candidates or space_dps(ctx.cluster.num_devices, settings.space)
    ):
        # Fix: fixed or listed values that no layout satisfies (e.g. --tp 3 on 8 devices, or
        # a ZeRO stage the framework lacks) are invalid input (exit 3), not "no feasible
        # plan" (exit 1, "no layout survived the refusal rules" — no rule had refused any).
        # The same when rules refused other degrees first (--cp 3 on 64 devices: only the
        # tp beyond the scale-up domain had been refused, by name).
        raise InvalidInputError(_empty_space_message(ctx, settings.space))
    unreachable = _unreachable_fixed_value(enum, settings.space)
    if not enum.candidates and unreachable is not None:
        # Fix: a fixed micro-batch size, VPP or schedule no layout can take was blamed on
        # whichever rule had refused something else (often tp beyond the scale-up domain).
        raise InvalidInputError(_unreachable_message(ctx, unreachable, enum.reached["pp"]))
    if not enum.candidates:
        # Fix: every layout refused by a rule was "no layout survived the refusal rules;
        # widen the search space" (exit 1), naming neither rule nor the fix. The space the
        # user fixed admits no valid layout: invalid input, with the rules that refused.
        raise InvalidInputError(_all_refused_message(ctx, enum.refused))
    t_enum = time.perf_counter()

    def remote(kind: str):
        def call(items: Sequence[Any]) -> list[Any]:
            return getattr(pricing, kind)(items)

        return call

    candidates = enum.candidates
    # Best-first with lazily refined bounds: a cheap bound for every candidate orders the
    # work; in that order, fixed-size batches get the cost model's step floor
    # (floor_bound), then in the order of that, the memory check and the exact bound
    # (every layer at its fastest option), and candidates are priced exactly in order of
    # the exact bound. Work stops once the K-th best plan beats every bound left. Batches
    # are decided by the bounds alone, so the result does not depend on executors.
    quick: list[float] = []
    for start in range(0, len(candidates), QUICK_CHUNK):
        quick += pricing.quick_bounds(candidates[start : start + QUICK_CHUNK])
        if hooks.progress is not None:
            hooks.progress("bound", len(quick), len(candidates))
    order_keys = [(q, tie_key(c)) for q, c in zip(quick, candidates, strict=True)]
    order = sorted(range(len(candidates)), key=order_keys.__getitem__)
    del order_keys
    # For the progress bar alone (how far the K-th best's bound has ruled candidates out).
    ascending_quick = [quick[i] for i in order] if hooks.progress is not None else []
    t_screen = time.perf_counter()
    k = settings.top_k
    # Without bounding every candidate is screened and priced, so nothing depends on where
    # batches end: a sixteenth of the candidates per batch spares the executor most waits
    # for its slowest worker at a batch boundary, and still moves the progress bar.
    screen_batch = SCREEN_BATCH if settings.bounding else max(SCREEN_BATCH, len(order) // 16)
    price_batch = BATCH if settings.bounding else max(BATCH, len(order) // 16)
    floors: list[tuple[float, tuple[int, ...], int]] = []  # the cost model's step floor
    heap: list[tuple[float, tuple[int, ...], int]] = []  # the exact bound, once screened
    results: list[tuple[float, int, tuple[int, ...], int, Priced]] = []
    # The best step time of each group the top K counts: a layout (its fastest split),
    # or with settings.distinct a device grid.
    group_of = shape_of if settings.distinct else layout_of
    group_best: dict[tuple[int, ...], float] = {}
    kth = math.inf
    # Bounds above max(kth, through) cannot change the output (through: the baseline's).
    through = -math.inf if settings.rank_through_s is None else settings.rank_through_s
    over_memory = 0
    closest: tuple[int, int, Candidate] | None = None
    pos = 0
    priced_count = 0
    settled_at = None  # priced when the top K alone would have stopped (then: the baseline's)
    t_memory = t_floor = 0.0

    def settled() -> int:
        """Candidates dealt with, for the progress bar: taken from the quick order, or
        ruled out already by the bound the K-th best plan sets (the bar then fills as
        the search ends, where counting the taken alone stopped it at a few percent)."""
        if not settings.bounding:
            return pos
        reach = bisect.bisect_right(ascending_quick, max(kth, through))
        return len(order) - max(0, reach - pos)

    while pos < len(order) or floors or heap:
        next_quick = quick[order[pos]] if pos < len(order) else math.inf
        next_floor = floors[0][0] if floors else math.inf
        next_exact = heap[0][0] if heap else math.inf
        next_bound = min(next_quick, next_floor, next_exact)
        if settings.bounding and max(kth, through) < next_bound:
            break
        if settled_at is None and settings.bounding and kth < next_bound:
            settled_at = priced_count  # bounds only grow and kth only falls: settled for good
        if next_quick <= min(next_floor, next_exact):
            # Refine the next quick bounds in this process (cheap; no executor involved).
            tick = time.perf_counter()
            batch = order[pos : pos + screen_batch]
            pos += len(batch)
            for i in batch:
                c = candidates[i]
                bound = pricing.floor_bound(c, quick[i]) if settings.bounding else quick[i]
                heapq.heappush(floors, (bound, tie_key(c), i))
            t_floor += time.perf_counter() - tick
            continue
        if next_floor <= next_exact:
            tick = time.perf_counter()
            popped = _pop_batch(
                floors, screen_batch, min(next_quick, next_exact), settings.bounding
            )
            batch = [i for _, _, i in popped]
            screened = run_phase(
                ctx,
                executor,
                task,
                recipe,
                "screen",
                [candidates[i] for i in batch],
                remote("screen"),
            )
            for i, s in zip(batch, screened, strict=True):
                if s.fits:
                    heapq.heappush(heap, (s.bound_s, tie_key(candidates[i]), i))
                    continue
                over_memory += 1
                if hooks.refusal is not None:
                    hooks.refusal(
                        candidate_dict(candidates[i]),
                        f"over_memory (stage {s.miss_stage} by {s.miss_bytes / GiB:.2f} GiB)",
                    )
                if closest is None or s.miss_bytes < closest[0]:
                    closest = (s.miss_bytes, s.miss_stage, candidates[i])
            t_memory += time.perf_counter() - tick
            if hooks.progress is not None:
                hooks.progress("price", settled(), len(order))
            continue
        batch_entries = _pop_batch(
            heap, price_batch, min(next_quick, next_floor), settings.bounding
        )
        items = [candidates[i] for _, _, i in batch_entries]
        priced = run_phase(ctx, executor, task, recipe, "price", items, remote("price"))
        priced_count += len(items)
        for (_, key, i), p in zip(batch_entries, priced, strict=True):
            if hooks.priced is not None and p.memory_parts is not None:
                hooks.priced(candidate_dict(candidates[i]), p.memory_parts, p.time_parts)
            if not p.fits:
                over_memory += 1
                continue
            results.append((p.step_s, p.peak_bytes, key, i, p))
            group = group_of(candidates[i])
            group_best[group] = min(group_best.get(group, math.inf), p.step_s)
        # The K-th best group: a candidate bounded above it can neither enter the top K
        # groups nor beat its own group's best, which is at most that.
        if len(group_best) >= k:
            kth = heapq.nsmallest(k, group_best.values())[-1]
        if hooks.progress is not None:
            hooks.progress("price", settled(), len(order))
    if hooks.progress is not None:
        hooks.progress("price", len(order), len(order))
    unexamined = (
        list(order[pos:]) + [i for _, _, i in sorted(floors)] + [i for _, _, i in sorted(heap)]
    )
    bounded = len(unexamined)
    # The least lower bound left unpriced: no candidate bounded out can step faster, so
    # every ranked plan faster than it has its exact rank.
    exact_below = min(
        quick[order[pos]] if pos < len(order) else math.inf,
        floors[0][0] if floors else math.inf,
        heap[0][0] if heap else math.inf,
    )
    if hooks.refusal is not None:
        for i in unexamined:
            hooks.refusal(candidate_dict(candidates[i]), "bounded")
    results.sort()
    if not results:
        raise InfeasibleError(_closest_message(ctx, closest))
    results = _first_of_each(results, candidates, layout_of)
    listed = _first_of_each(results, candidates, shape_of, k) if settings.distinct else results[:k]
    whole = run_phase(
        ctx,
        executor,
        task,
        recipe,
        "plans",
        [candidates[i] for _, _, _, i, _ in listed],
        remote("plans"),
    )
    plans = [plan.model_copy(update={"rank": rank}) for rank, plan in enumerate(whole, start=1)]
    t_end = time.perf_counter()
    summary = SearchSummary(
        generated=enum.generated,
        refused=dict(sorted(enum.refused.items())),
        over_memory=over_memory,
        bounded=bounded,
        priced=priced_count,
        priced_for_baseline=None
        if settings.rank_through_s is None
        else (0 if settled_at is None else priced_count - settled_at),
        never_tried=enum.never_tried(settings.space),
        distinct=True if settings.distinct else None,
        seconds=PhaseTimes(
            enumerate=t_enum - t0,
            bound=t_screen - t_enum + t_floor,
            memory=t_memory,
            price=t_end - t_screen - t_memory - t_floor,
            total=t_end - t0,
        ),
    )
    ranking = tuple((candidate_dict(candidates[i]), p) for _, _, _, i, p in results)
    layers_per_chunk = tuple(uneven_split_text(ctx, candidates[i]) for _, _, _, i, _ in results)
    result = SearchResult(
        summary=summary,
        plans=tuple(plans),
        assumptions=tuple(a.describe() for a in ctx.recorder.items),
    )
    return SearchOutcome(
        result=result, ranking=ranking, layers_per_chunk=layers_per_chunk, exact_below=exact_below
    )


def _first_of_each(
    results: list,
    candidates: Sequence[Candidate],
    group_of: Callable[[Candidate], tuple[int, ...]],
    k: int | None = None,
) -> list:
    """The first (up to ``k``) ranked results of distinct groups (``results`` sorted)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for entry in results:
        group = group_of(candidates[entry[3]])
        if group not in seen:
            seen.add(group)
            out.append(entry)
            if len(out) == k:
                break
    return out


def place_in_ranking(
    ranking: Sequence[tuple[dict[str, Any], Priced]], own: dict[str, Any], own_priced: Priced
) -> tuple[int, int]:
    """A layout's rank in a search's ranking and the device grids other than its own with
    a faster layout. The ranking must hold every layout faster than it
    (``SearchSettings.rank_through_s``). A layout outside the searched space ranks after
    those faster, or as fast with less memory."""
    ahead = next((i for i, (cand, _) in enumerate(ranking) if cand == own), None)
    if ahead is None:
        mark = (own_priced.step_s, own_priced.peak_bytes)
        ahead = sum(1 for _, p in ranking if (p.step_s, p.peak_bytes) < mark)

    def grid(cand: dict[str, Any]) -> tuple[int, ...]:
        return tuple(cand[f] for f in FIELDS[:6])  # as shape_of: tp, pp, cp, dp, ep, etp

    return ahead + 1, len({grid(cand) for cand, _ in ranking[:ahead]} - {grid(own)})


@dataclass(frozen=True)
class SearchOutcome:
    """The result, plus every kept plan in rank order (for --ranking-csv)."""

    result: SearchResult
    ranking: tuple[tuple[dict[str, Any], Priced], ...]
    layers_per_chunk: tuple[str | None, ...]
    """Per ranked plan, an uneven split's layers per chunk (None for the default split)."""
    exact_below: float = math.inf
    """Ranked plans stepping faster than this have their exact rank among every layout:
    the least bound of the candidates bounded out (inf when none was)."""

    @property
    def exactly_ranked(self) -> int:
        """How many of the ranked plans, from the first, have their exact rank."""
        return bisect.bisect_left([p.step_s for _, p in self.ranking], self.exact_below)


def _pop_batch(
    heap: list[tuple[float, tuple[int, ...], int]], size: int, limit: float, bounding: bool
) -> list[tuple[float, tuple[int, ...], int]]:
    """Up to ``size`` entries off the heap, least bound first; when bounding, only the
    least and those bounded no later than ``limit`` (the next bound of the other queues).
    A fixed-size batch went past it: it screened or priced candidates whose bounds the
    K-th best would have ruled out once known. Still decided by the bounds alone."""
    out = [heapq.heappop(heap)]
    while heap and len(out) < size and (not bounding or heap[0][0] <= limit):
        out.append(heapq.heappop(heap))
    return out


def _unreachable_fixed_value(enum: Enumeration, space: SearchSpace) -> tuple[str, tuple] | None:
    """(dimension, its values) of the fixed micro-batch size, VPP or schedule list of which
    no value was reachable, if one stopped every layout."""
    # In loop order: a micro-batch size no layout takes leaves no schedule to reach, so
    # only the first dimension that stops every layout is the cause.
    # Only past the degrees: when the tp/pp/cp rules or the batch refused every shape,
    # those rules are the cause (the all-refused message names them).
    if not enum.batch_ok:
        return None
    for name in ("mbs", "vpp", "schedule"):
        if name != "mbs" and not enum.reached["pp"]:
            break  # the rules before the schedule (e.g. on EP) stopped every layout
        values = getattr(space, name)
        if values is not None and not set(values) & enum.reached[name]:
            return name, values
    return None


def _unreachable_message(
    ctx: PricingContext, unreachable: tuple[str, tuple], pipeline_depths: set[int]
) -> str:
    why = {
        "mbs": f"dp·mbs must divide the global batch ({ctx.job.global_batch_size}) for "
        "some dp the devices allow",
        "vpp": f"pp·vpp chunks must split the {ctx.model.num_layers} layers evenly (or the "
        "layers plus the embedding and the loss, each stage within one of the fullest)",
        "schedule": "a pipeline schedule needs pp > 1 (DualPipeV: at least 2·pp layers; "
        "interleaved: a VPP that splits the layers)",
    }
    name, values = unreachable
    if name == "vpp" and min(values) > 1 and pipeline_depths <= {1}:
        # Only unpipelined layouts got this far (pp fixed to 1, or no other pp fits):
        # there are no stages to interleave chunks over, whatever the layer count.
        why["vpp"] = "interleaving needs pp > 1, and no layout here pipelines"
    return (
        f"{name} {'|'.join(map(str, values))} fits no layout of {ctx.cluster.num_devices} "
        f"devices: {why[name]}; change it or let it vary"
    )


def _empty_space_message(ctx: PricingContext, space: SearchSpace) -> str:
    names = ("tp", "pp", "cp", "dp", "ep", "etp", "vpp", "mbs", "zero", "sp", "schedule")
    stated = [
        f"{name} {'|'.join(str(v) for v in getattr(space, name))}"
        for name in names
        if getattr(space, name) is not None
    ]
    return (
        f"no layout of {ctx.cluster.num_devices} devices matches the search space"
        f"{' (' + ', '.join(stated) + ')' if stated else ''}: tp·pp·cp·dp must equal the "
        f"device count, dp·mbs must divide the global batch ({ctx.job.global_batch_size}), and "
        f"zero, sp and the schedule must be ones {ctx.framework.name} offers; change a fixed value"
    )


def _all_refused_message(ctx: PricingContext, refused: Counter) -> str:
    reasons = ", ".join(f"{name} {count:,}" for name, count in sorted(refused.items()))
    hint = ""
    if set(refused) == {"tp_beyond_scale_up_domain"}:
        hint = (
            f" (a TP beyond the {ctx.cluster.scale_up_domain}-device scale-up domain "
            "needs --max-tp)"
        )
    return (
        f"every layout in the search space is refused ({reasons}); relax the fixed values "
        f"these rules refuse{hint}"
    )


def _closest_message(ctx: PricingContext, closest: tuple[int, int, Candidate] | None) -> str:
    if closest is None:
        return "no layout survived the refusal rules; widen the search space"
    over, stage, c = closest
    d = candidate_dict(c)
    # Fix: name the whole layout. The line left out vpp, etp, sp, the schedule, optimizer
    # offload and the recompute policy, so the miss could not be reproduced with
    # `ndplan estimate` (the closest miss is often an offloaded layout), and it claimed
    # "even with full recompute" for a fixed policy that was priced as stated.
    keys = ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "mbs", "zero")
    degrees = " ".join(f"{k} {d[k]}" for k in keys)
    auto = d["recompute"] in ("auto", "stated")
    # auto, and none where offload is offered, were priced with every layer offloaded;
    # stated with full recompute (no config offloads every layer)
    offload = d["recompute"] in ("auto", "none") and activation_offload_offered(ctx)
    lightest = "activations offloaded" if offload else "recompute full"
    extras = [f"sp {'on' if d['sp'] else 'off'}", d["schedule"]]
    if not auto:
        extras.append(f"recompute {d['recompute']}")
    if auto or offload:
        extras.append(lightest)
    if d["offload_optimizer"]:
        extras.append("optimizer offloaded")
    return (
        f"no layout fits in {ctx.budget_bytes / GiB:.2f} GiB per device"
        f"{' even with activation offload' if offload else ''}"
        f"{' even with full recompute' if auto and not offload else ''}; closest: "
        f"{degrees} ({', '.join(extras)}) is over by {over / GiB:.2f} GiB on stage {stage}"
    )
