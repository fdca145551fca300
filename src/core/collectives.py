"""Collectives priced with the alpha–beta model over the links a group spans.

Ring algorithms (spec/performance.md): all-reduce ``2·(n−1)/n · S/bw + 2·(n−1)·α``;
all-gather and reduce-scatter ``(n−1)/n · S/bw + (n−1)·α``; all-to-all
``(n−1)/n · S/bw``, where ``S`` is the full (gathered) size and ``bw`` the
per-direction bandwidth of the slowest link the group crosses, times an achieved
bus-bandwidth fraction. Which links a group crosses depends on the placement
order of the dimensions (TP innermost by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb

from .calibration import DeviceEfficiency
from .cluster import Cluster

DEFAULT_ORDER = ("tp", "cp", "dp", "pp")
"""Placement order, innermost first: TP inside a node, PP outermost. EP is carved out
of the DP (and CP, TP) ranks, so it sits where DP does."""


@dataclass(frozen=True, slots=True)
class GroupLink:
    """What one communication group of a layout runs over."""

    size: int
    bytes_per_s: float
    """Achieved per-direction bandwidth of the slowest link the ring crosses."""
    latency_s: float
    members_per_domain: int
    """Group members inside one scale-up domain (for all-to-all's intra/inter split)."""
    intra_bytes_per_s: float
    """Achieved per-direction scale-up bandwidth (all-to-all's in-domain share)."""
    inter_bytes_per_s: float = float("inf")
    """Achieved per-device network bandwidth (all-to-all's out-of-domain share)."""


def group_link(cluster: Cluster, eff: DeviceEfficiency, size: int, stride: int) -> GroupLink:
    """A group of ``size`` ranks spaced ``stride`` apart in the rank order."""
    device = cluster.device
    domain = cluster.scale_up_domain
    up = device.scale_up
    intra = up.group_bytes_per_s(max(2, min(size, domain))) * eff.scale_up_bus
    if size <= 1:
        return GroupLink(1, float("inf"), 0.0, 1, float("inf"))
    span = stride * size
    if span <= domain:
        return GroupLink(
            size, up.group_bytes_per_s(size) * eff.scale_up_bus, up.latency_s, size, intra
        )
    members = max(1, domain // stride) if stride < domain else 1
    if members > 1:
        # Fix (tests/unit/test_collectives.py): on a mesh, k members of a domain reach each
        # other over only their k − 1 direct links, as a k-member group inside the domain.
        intra = up.group_bytes_per_s(members) * eff.scale_up_bus
    out = device.scale_out
    # A ring crossing domains enters each domain once per channel; with one NIC per
    # device and a channel per NIC, the group's k members in a domain share the load, so
    # the ring runs at k × the per-device network rate (capped by the in-domain hops).
    # The measured multi-rack NVL72 FSDP runs need the whole rack's NICs: counting only
    # one host's four over-predicts their step time by more than 2×.
    ring = min(members * out.bytes_per_s * eff.scale_out_bus, intra)
    return GroupLink(size, ring, out.latency_s, members, intra, out.bytes_per_s * eff.scale_out_bus)


def ring_latency_s(link: GroupLink) -> float:
    """The per-hop latency one ring all-gather or reduce-scatter pays, whatever its size."""
    return (link.size - 1) * link.latency_s


def all_gather_s(link: GroupLink, total_bytes: float) -> float:
    """All-gather (or reduce-scatter) of a tensor of ``total_bytes`` in all."""
    n = link.size
    if n <= 1 or total_bytes <= 0:
        return 0.0
    return (n - 1) / n * total_bytes / link.bytes_per_s + ring_latency_s(link)


reduce_scatter_s = all_gather_s


def all_reduce_s(link: GroupLink, total_bytes: float) -> float:
    n = link.size
    if n <= 1 or total_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * total_bytes / link.bytes_per_s + 2 * (n - 1) * link.latency_s


def all_to_all_s(link: GroupLink, bytes_per_rank: float) -> float:
    """All-to-all where each rank sends ``bytes_per_rank`` spread evenly over the group.

    Traffic to peers in the same scale-up domain moves at the scale-up rate, the rest
    over the scale-out link; the two proceed concurrently, the slower one decides.
    """
    n = link.size
    if n <= 1 or bytes_per_rank <= 0:
        return 0.0
    local = min(link.members_per_domain, n)
    intra = (local - 1) / n * bytes_per_rank / link.intra_bytes_per_s
    inter = (n - local) / n * bytes_per_rank / link.inter_bytes_per_s if local < n else 0.0
    return max(intra, inter) + link.latency_s


def deduplicated_all_to_all_s(
    link: GroupLink,
    token_bytes: float,
    experts: int,
    top_k: int,
    groups: int = 1,
    groups_per_token: int = 1,
) -> float:
    """DeepEP/HybridEP dispatch (or combine) of a rank's tokens, ``token_bytes`` for one
    copy of each, every token routed to ``top_k`` of ``experts`` experts spread evenly
    over the group; with group-limited routing (DeepSeek's ``n_group``/``topk_group``)
    only among the experts of ``groups_per_token`` of ``groups`` contiguous groups.

    A token moves once to each rank holding any of its experts, and over the network
    once to each remote scale-up domain holding any, where it is forwarded to those ranks:
    it costs the expected number of distinct ranks and domains its experts fall on, not
    ``top_k`` copies. Group-limited routing exists to cut that count where a group lies
    on one node. The scale-up links carry each delivery from a different member of its
    domain; the network carries each remote domain's one copy.
    """
    n = link.size
    if n <= 1 or token_bytes <= 0:
        return 0.0
    local = min(link.members_per_domain, n)
    routing = (experts, top_k, groups, groups_per_token)
    per_rank = experts // n
    ranks = expected_holders_reached(*routing, per_rank)
    intra = ranks * (local - 1) / local * token_bytes / link.intra_bytes_per_s
    inter = 0.0
    if local < n:
        domains = n / local
        reached = expected_holders_reached(*routing, per_rank * local)
        inter = reached * (domains - 1) / domains * token_bytes / link.inter_bytes_per_s
    return max(intra, inter) + link.latency_s


@lru_cache(maxsize=256)
def expected_holders_reached(
    experts: int, top_k: int, groups: int, groups_per_token: int, held: int
) -> float:
    """Expected number of holders (ranks or domains, each holding a contiguous block of
    ``held`` experts) that a token's ``top_k`` experts fall on, under uniform routing:
    ``groups_per_token`` of the ``groups`` contiguous expert groups drawn at random, then
    ``top_k`` experts at random among theirs (one group: plain top-k).

    A holder overlapping the groups by ``a_i`` experts is missed with probability
    E_Q[C(S − Σ_{i∈Q} a_i, k) / C(S, k)] over the drawn set Q, S = ``groups_per_token`` ·
    experts / groups; the distribution of Σ a_i over Q is counted exactly. Where the
    blocks do not tile the experts (an EP group of 128 over 72-GPU racks), the partial
    last holder counts as its fraction of one, at the mean of the whole ones.
    """
    group_size = experts // groups
    candidates = groups_per_token * group_size
    draws = comb(groups, groups_per_token) * comb(candidates, top_k)
    whole = experts // held
    hit = 0.0
    for holder in range(whole):
        first, last = holder * held, (holder + 1) * held
        overlaps = [
            min(last, (g + 1) * group_size) - max(first, g * group_size)
            for g in range(first // group_size, min(groups, -(-last // group_size)))
        ]
        # ways[c][x]: sets of c of the overlapped groups whose overlaps sum to x.
        ways = [[0] * (held + 1) for _ in range(len(overlaps) + 1)]
        ways[0][0] = 1
        for a in overlaps:
            for c in range(len(overlaps), 0, -1):
                for x in range(held, a - 1, -1):
                    ways[c][x] += ways[c - 1][x - a]
        others = groups - len(overlaps)
        missed = sum(
            count * comb(others, groups_per_token - c) * comb(candidates - x, top_k)
            for c, row in enumerate(ways[: groups_per_token + 1])
            for x, count in enumerate(row)
            if count
        )
        hit += 1 - missed / draws
    return experts / held * hit / whole


def send_recv_s(link: GroupLink, nbytes: float) -> float:
    if nbytes <= 0 or link.size <= 1:
        return 0.0
    return nbytes / link.bytes_per_s + link.latency_s
