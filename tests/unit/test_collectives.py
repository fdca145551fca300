"""Collectives by hand: the alpha–beta ring formulas and the links a group spans.

Figures are the catalog's (per direction): H100 SXM scale-up 450 GB/s, 3 µs, domain 8;
scale-out 50 GB/s per device, 8 µs. MI300X: a fully connected 8-GPU mesh, 448 GB/s in
all over 7 links. GB200: an NVL72 domain of 18 four-GPU hosts, 900 GB/s NVLink, a
50 GB/s NIC per GPU. Default bus efficiencies: 0.75 scale-up, 0.80 scale-out.

A ring crossing scale-up domains runs at min(k × scale-out × bus, in-domain rate), k the
group's members per scale-up domain: they share the crossing over all of the domain's
NICs (an NVL72 rack's 72, not one four-GPU host's).
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ndplan.adapters.devices.catalog import builtin_devices
from ndplan.core.calibration import DeviceEfficiency
from ndplan.core.cluster import Cluster, DeviceSpec
from ndplan.core.collectives import (
    GroupLink,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    deduplicated_all_to_all_s,
    expected_holders_reached,
    group_link,
    reduce_scatter_s,
    send_recv_s,
)

DEVICES = {d.id: d for d in builtin_devices()}
EFF = DeviceEfficiency()
UP_BUS, OUT_BUS = EFF.scale_up_bus, EFF.scale_out_bus
H100_UP = 450e9 * UP_BUS
H100_OUT = 50e9 * OUT_BUS


def cluster(device_id: str = "h100-sxm", n: int = 64, **update) -> Cluster:
    device = DEVICES[device_id]
    if update:
        device = device.model_copy(update=update)
    return Cluster(device=device, num_devices=n)


def link(size: int, bw: float, alpha: float, members: int | None = None) -> GroupLink:
    members = size if members is None else members
    return GroupLink(size, bw, alpha, members, bw)


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("nbytes", [1.0, 1e6, 3.7e9])
def test_ring_all_reduce_formula(n: int, nbytes: float) -> None:
    bw, alpha = 100e9, 5e-6
    expected = 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha
    assert math.isclose(all_reduce_s(link(n, bw, alpha), nbytes), expected, rel_tol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("nbytes", [1.0, 1e6, 3.7e9])
def test_all_gather_and_reduce_scatter_formula(n: int, nbytes: float) -> None:
    bw, alpha = 100e9, 5e-6
    expected = (n - 1) / n * nbytes / bw + (n - 1) * alpha
    lk = link(n, bw, alpha)
    assert math.isclose(all_gather_s(lk, nbytes), expected, rel_tol=1e-12)
    assert math.isclose(reduce_scatter_s(lk, nbytes), expected, rel_tol=1e-12)
    # A ring all-reduce is a reduce-scatter followed by an all-gather.
    assert math.isclose(
        all_reduce_s(lk, nbytes), all_gather_s(lk, nbytes) + reduce_scatter_s(lk, nbytes)
    )


@pytest.mark.parametrize(("size", "stride"), [(2, 1), (8, 1), (16, 1), (8, 8), (64, 2)])
def test_all_reduce_is_two_reduce_scatters_on_real_links(size: int, stride: int) -> None:
    """What the step model prices ZeRO-0's gradient all-reduce as (twice the per-stage
    reduce-scatter volume): exact on every link, latency included."""
    lk = group_link(cluster(n=128), EFF, size, stride)
    for nbytes in (1.0, 3.7e9):
        assert all_reduce_s(lk, nbytes) == pytest.approx(
            2 * reduce_scatter_s(lk, nbytes), rel=1e-12
        )


def test_hand_computed_h100_node_all_reduce() -> None:
    """TP = 8 on one DGX H100: 1 GB all-reduce over NVLink at 0.75 × 450 GB/s."""
    lk = group_link(cluster(), EFF, 8, 1)
    expected = 2 * 7 / 8 * 1e9 / 337.5e9 + 2 * 7 * 3e-6
    assert all_reduce_s(lk, 1e9) == pytest.approx(expected, rel=1e-12)
    assert all_reduce_s(lk, 1e9) == pytest.approx(5.227e-3, rel=1e-3)


def test_send_recv() -> None:
    lk = link(2, 40e9, 8e-6)
    assert send_recv_s(lk, 4e9) == pytest.approx(4e9 / 40e9 + 8e-6, rel=1e-12)
    assert send_recv_s(lk, 0) == 0.0
    assert send_recv_s(link(1, 40e9, 8e-6), 4e9) == 0.0


def test_single_rank_and_empty_messages_cost_nothing() -> None:
    one = group_link(cluster(), EFF, 1, 1)
    assert one.size == 1
    for fn in (all_reduce_s, all_gather_s, reduce_scatter_s, all_to_all_s, send_recv_s):
        assert fn(one, 1e9) == 0.0
        assert fn(group_link(cluster(), EFF, 8, 1), 0.0) == 0.0
    # Even a single rank spaced far apart (a DP group of 1 with TP = 8) is free.
    assert all_reduce_s(group_link(cluster(), EFF, 1, 8), 1e9) == 0.0


def test_latency_term_alone_for_tiny_messages() -> None:
    lk = link(8, 1e30, 3e-6)
    assert all_reduce_s(lk, 1.0) == pytest.approx(2 * 7 * 3e-6)
    assert all_gather_s(lk, 1.0) == pytest.approx(7 * 3e-6)


# ----------------------------------------------------------------------------- all-to-all


def test_all_to_all_inside_one_domain() -> None:
    """All peers on the scale-up fabric: (n − 1)/n · S / bw (+ one latency)."""
    lk = group_link(cluster(), EFF, 8, 1)
    assert lk.inter_bytes_per_s == math.inf
    expected = 7 / 8 * 1e9 / H100_UP + 3e-6
    assert all_to_all_s(lk, 1e9) == pytest.approx(expected, rel=1e-12)


def test_all_to_all_split_between_scale_up_and_scale_out() -> None:
    """EP = 32 over four H100 nodes: 7 of 32 peers over NVLink, 24 over the network;
    the two run concurrently and the slower (network) share decides."""
    lk = group_link(cluster(), EFF, 32, 1)
    assert lk.members_per_domain == 8
    assert lk.intra_bytes_per_s == pytest.approx(H100_UP)
    assert lk.inter_bytes_per_s == pytest.approx(H100_OUT)
    intra = 7 / 32 * 1e9 / H100_UP
    inter = 24 / 32 * 1e9 / H100_OUT
    assert inter > intra
    assert all_to_all_s(lk, 1e9) == pytest.approx(inter + 8e-6, rel=1e-12)


def test_all_to_all_in_domain_share_decides_when_network_is_fast() -> None:
    lk = GroupLink(16, 1.0, 1e-6, members_per_domain=8, intra_bytes_per_s=10e9,
                   inter_bytes_per_s=1e15)  # fmt: skip
    expected = 7 / 16 * 1e9 / 10e9 + 1e-6
    assert all_to_all_s(lk, 1e9) == pytest.approx(expected, rel=1e-9)


def test_all_to_all_one_member_per_domain_is_all_network() -> None:
    lk = group_link(cluster(), EFF, 8, 8)  # stride 8: one rank per node
    assert lk.members_per_domain == 1
    expected = 7 / 8 * 1e9 / H100_OUT + 8e-6
    assert all_to_all_s(lk, 1e9) == pytest.approx(expected, rel=1e-12)


def _expected_reached(
    experts: int, top_k: int, per_holder: int, groups: int = 1, groups_per_token: int = 1
) -> float:
    """Distinct holders (contiguous blocks of ``per_holder`` experts) a token's experts
    fall on, averaged over every routing: every choice of ``groups_per_token`` of the
    contiguous groups, then every choice of top_k of their experts, equally likely (one
    group: plain uniform top-k)."""
    size = experts // groups
    hits = [
        len({e // per_holder for e in chosen})
        for drawn in itertools.combinations(range(groups), groups_per_token)
        for chosen in itertools.combinations(
            [g * size + i for g in drawn for i in range(size)], top_k
        )
    ]
    return sum(hits) / len(hits)


@pytest.mark.parametrize(("experts", "top_k"), [(8, 1), (8, 3), (16, 4), (12, 6)])
def test_deduplicated_dispatch_inside_one_domain_sends_once_per_rank_reached(
    experts: int, top_k: int
) -> None:
    """DeepEP inside one node: a token goes once to each rank holding any of its experts
    (all but the ones it sits on), the expected count over every routing; all-to-all
    sends top_k copies."""
    lk = GroupLink(4, 1.0, 1e-6, members_per_domain=4, intra_bytes_per_s=10e9)
    ranks = _expected_reached(experts, top_k, experts // 4)
    expected = ranks * 3 / 4 * 1e9 / 10e9 + 1e-6
    assert deduplicated_all_to_all_s(lk, 1e9, experts, top_k) == pytest.approx(expected, rel=1e-12)
    assert deduplicated_all_to_all_s(lk, 1e9, experts, top_k) <= all_to_all_s(lk, top_k * 1e9)


def test_deduplicated_dispatch_crosses_the_network_once_per_remote_domain() -> None:
    """EP = 16 over two H100 nodes (DeepEP internode): a token crosses the network once to
    the other node if any of its experts is there, then NVLink forwards it; with Qwen3-30B's
    128 experts and top-8 that is ~1 network copy where all-to-all sends 8 · 8/16 = 4."""
    lk = group_link(cluster(), EFF, 16, 1)
    assert lk.members_per_domain == 8
    # The other node is missed only when all 8 experts are among this node's 64.
    remote = 1 - math.comb(64, 8) / math.comb(128, 8)
    inter = remote * 1e9 / H100_OUT
    intra = 16 * (1 - math.comb(120, 8) / math.comb(128, 8)) * 7 / 8 * 1e9 / H100_UP
    assert inter > intra
    got = deduplicated_all_to_all_s(lk, 1e9, 128, 8)
    assert got == pytest.approx(inter + 8e-6, rel=1e-12)
    assert got < all_to_all_s(lk, 8 * 1e9) / 3.9


def test_deduplicated_dispatch_of_one_expert_crosses_the_network_as_all_to_all() -> None:
    """top-1: nothing to deduplicate, so the network share equals all-to-all's; only the
    forwarding hop inside the remote node is added on NVLink."""
    lk = group_link(cluster(), EFF, 32, 1)
    one = deduplicated_all_to_all_s(lk, 1e9, 64, 1)
    assert one == pytest.approx(all_to_all_s(lk, 1e9), rel=1e-12)


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "groups_per_token", "per_holder"),
    [
        (16, 3, 4, 2, 2),  # a rank holds part of a group
        (16, 3, 4, 2, 4),  # a rank holds one group
        (16, 4, 4, 2, 8),  # a domain holds two groups
        (24, 2, 8, 3, 4),  # holders straddle groups
        (12, 2, 3, 1, 6),  # every token inside one group
        (16, 3, 1, 1, 4),  # no grouping: plain top-k
    ],
)
def test_group_limited_reach_counts_every_routing(
    experts: int, top_k: int, groups: int, groups_per_token: int, per_holder: int
) -> None:
    got = expected_holders_reached(experts, top_k, groups, groups_per_token, per_holder)
    brute = _expected_reached(experts, top_k, per_holder, groups, groups_per_token)
    assert got == pytest.approx(brute, rel=1e-12)


@st.composite
def aligned_group_routing(draw) -> tuple[int, int, int, int, int]:
    """(experts, top_k, groups, groups_per_token, held) with each holder inside one group
    or a union of whole groups, as EP places experts (powers of two)."""
    experts = 2 ** draw(st.integers(2, 8))
    groups = 2 ** draw(st.integers(0, min(5, experts.bit_length() - 2)))
    size = experts // groups
    per_token = draw(st.integers(1, groups))
    top_k = draw(st.integers(1, min(16, per_token * size)))
    held = 2 ** draw(st.integers(0, experts.bit_length() - 2))
    return experts, top_k, groups, per_token, held


@settings(max_examples=300, deadline=None)
@given(aligned_group_routing())
def test_group_limits_only_concentrate_a_tokens_reach(case) -> None:
    """A token reaches at least one holder, at most top_k, all holders, or those of its
    allowed groups; limiting its groups never spreads it wider, and allowing one more
    group never narrows it."""
    experts, top_k, groups, per_token, held = case
    reach = expected_holders_reached(experts, top_k, groups, per_token, held)
    size = experts // groups
    allowed = per_token * size // held if held <= size else per_token
    assert 1 - 1e-12 <= reach <= min(top_k, experts // held, allowed) + 1e-12
    assert reach <= expected_holders_reached(experts, top_k, 1, 1, held) + 1e-12
    if per_token < groups:
        wider = expected_holders_reached(experts, top_k, groups, per_token + 1, held)
        assert reach <= wider + 1e-12


def test_node_limited_routing_keeps_deepseek_v3_to_four_nodes() -> None:
    """DeepSeek-V3 at EP 64 over eight H100 nodes: each node holds one of the 8 groups of
    32 experts, and a token's 8 experts come from 4 groups, so it reaches at most 4 nodes
    (3.63 expected) where unlimited routing reaches 5.29; the network share falls by that
    ratio and NVLink barely changes."""
    lk = group_link(cluster(n=1024), EFF, 64, 1)
    assert lk.members_per_domain == 8
    assert expected_holders_reached(256, 8, 8, 4, 32) == pytest.approx(
        4 * (1 - math.comb(96, 8) / math.comb(128, 8)), rel=1e-12
    )
    limited = deduplicated_all_to_all_s(lk, 1e9, 256, 8, 8, 4)
    free = deduplicated_all_to_all_s(lk, 1e9, 256, 8)
    assert free == pytest.approx(deduplicated_all_to_all_s(lk, 1e9, 256, 8, 1, 1), rel=1e-12)
    domains = 4 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert limited == pytest.approx(domains * 7 / 8 * 1e9 / H100_OUT + 8e-6, rel=1e-12)
    assert (limited - 8e-6) / (free - 8e-6) == pytest.approx(0.685, abs=0.001)


# ----------------------------------------------------------------------------- group_link


@pytest.mark.parametrize(("size", "stride"), [(2, 1), (4, 1), (8, 1), (2, 4), (4, 2)])
def test_group_inside_one_domain_uses_scale_up(size: int, stride: int) -> None:
    lk = group_link(cluster(), EFF, size, stride)
    assert lk.size == size
    assert lk.bytes_per_s == pytest.approx(H100_UP)
    assert lk.intra_bytes_per_s == pytest.approx(H100_UP)
    assert lk.latency_s == pytest.approx(3e-6)
    assert lk.members_per_domain == size


def test_bus_efficiency_scales_the_link() -> None:
    eff = DeviceEfficiency(scale_up_bus=0.5, scale_out_bus=0.25)
    assert group_link(cluster(), eff, 8, 1).bytes_per_s == pytest.approx(225e9)
    assert group_link(cluster(), eff, 8, 8).bytes_per_s == pytest.approx(12.5e9)


@pytest.mark.parametrize(
    ("size", "stride", "members"),
    [(16, 1, 8), (64, 1, 8), (8, 2, 4), (4, 4, 2), (8, 8, 1), (2, 32, 1), (3, 8, 1)],
)
def test_group_spanning_domains_runs_at_k_times_scale_out(
    size: int, stride: int, members: int
) -> None:
    """k members per domain (here also per node: an H100 node is its domain) share the
    crossing: the ring runs at k × the per-device network rate, capped by the scale-up
    hops."""
    lk = group_link(cluster(), EFF, size, stride)
    assert lk.members_per_domain == members
    assert lk.latency_s == pytest.approx(8e-6)
    assert lk.bytes_per_s == pytest.approx(min(members * H100_OUT, H100_UP))
    assert lk.inter_bytes_per_s == pytest.approx(H100_OUT)


def test_spanning_ring_is_capped_by_scale_up() -> None:
    """With a 100 GB/s NIC per GPU, 8 × 80 GB/s would beat NVLink: NVLink caps it."""
    out = DEVICES["h100-sxm"].scale_out.model_copy(update={"bandwidth_gb_per_s": 100.0})
    lk = group_link(cluster(scale_out=out), EFF, 16, 1)
    assert 8 * 100e9 * OUT_BUS > H100_UP
    assert lk.bytes_per_s == pytest.approx(H100_UP)
    # Two members per domain: 2 × 80 GB/s is below the cap.
    assert group_link(cluster(scale_out=out), EFF, 8, 4).bytes_per_s == pytest.approx(160e9)


def test_spanning_is_decided_by_stride_times_size() -> None:
    c = cluster()
    assert group_link(c, EFF, 4, 2).latency_s == pytest.approx(3e-6)  # span 8: one node
    assert group_link(c, EFF, 4, 4).latency_s == pytest.approx(8e-6)  # span 16: two nodes


def test_nvl72_domain_keeps_large_groups_on_nvlink() -> None:
    c = Cluster(device=DEVICES["gb200"], num_devices=144)
    assert c.scale_up_domain == 72
    up = 900e9 * UP_BUS
    assert group_link(c, EFF, 64, 1).bytes_per_s == pytest.approx(up)
    assert group_link(c, EFF, 8, 8).bytes_per_s == pytest.approx(up)  # span 64 ≤ 72
    assert group_link(c, EFF, 72, 1).latency_s == DEVICES["gb200"].scale_up.latency_s
    # 144 ranks cross two racks: 72 per rack, capped by NVLink.
    assert group_link(c, EFF, 144, 1).bytes_per_s == pytest.approx(min(72 * 40e9, up))


GB200_OUT = 50e9 * OUT_BUS
GB200_UP = 900e9 * UP_BUS


@pytest.mark.parametrize(
    ("size", "stride", "members", "expected"),
    [
        (144, 1, 72, GB200_UP),  # 72 × 40 GB/s = 2880 GB/s: NVLink's 675 GB/s caps it
        (144, 2, 36, GB200_UP),  # 1440 GB/s: capped
        (36, 4, 18, GB200_UP),  # 720 GB/s: capped
        (18, 8, 9, 9 * GB200_OUT),  # 360 GB/s, though no host holds two members
        (4, 36, 2, 2 * GB200_OUT),
        (2, 72, 1, GB200_OUT),  # one member per rack
    ],
)
def test_nvl72_ring_crossing_racks_shares_the_whole_racks_nics(
    size: int, stride: int, members: int, expected: float
) -> None:
    """GB200 NVL72: a ring leaving the rack shares the crossing among the group's members
    in the whole 72-GPU domain (and their NICs), not only those in one four-GPU host."""
    c = Cluster(device=DEVICES["gb200"], num_devices=1024)
    assert (c.scale_up_domain, c.per_node) == (72, 4)
    lk = group_link(c, EFF, size, stride)
    assert lk.members_per_domain == members
    assert lk.bytes_per_s == pytest.approx(expected, rel=1e-12)
    assert lk.bytes_per_s == pytest.approx(min(members * GB200_OUT, GB200_UP), rel=1e-12)
    assert lk.intra_bytes_per_s == pytest.approx(GB200_UP)
    assert lk.inter_bytes_per_s == pytest.approx(GB200_OUT)
    assert lk.latency_s == pytest.approx(DEVICES["gb200"].scale_out.latency_s)
    # A 1 GB all-reduce at that rate: 2·(n − 1)/n · S / bw + 2·(n − 1)·α.
    ar = 2 * (size - 1) / size * 1e9 / expected + 2 * (size - 1) * 8e-6
    assert all_reduce_s(lk, 1e9) == pytest.approx(ar, rel=1e-12)


def test_ring_crossing_domains_shares_the_domain_not_the_host() -> None:
    """H100 hosts of four GPUs in an eight-GPU NVLink domain: a 16-rank ring has 8 members
    per domain, and runs at 8 × the per-GPU network rate, not 4 × (one host's NICs)."""
    c = Cluster(device=DEVICES["h100-sxm"], num_devices=64, devices_per_node=4)
    assert (c.scale_up_domain, c.per_node) == (8, 4)
    lk = group_link(c, EFF, 16, 1)
    assert lk.members_per_domain == 8
    assert lk.bytes_per_s == pytest.approx(8 * H100_OUT, rel=1e-12)
    assert group_link(c, EFF, 16, 2).bytes_per_s == pytest.approx(4 * H100_OUT, rel=1e-12)
    assert group_link(c, EFF, 8, 4).bytes_per_s == pytest.approx(2 * H100_OUT, rel=1e-12)
    # The same as with eight-GPU hosts (the default).
    assert group_link(cluster(), EFF, 16, 1).bytes_per_s == pytest.approx(lk.bytes_per_s)


def test_more_members_per_domain_never_slow_a_crossing_ring() -> None:
    """A tighter stride puts more of the group in each domain: never a slower ring."""
    for device_id in ("gb200", "h100-sxm", "mi300x", "ascend-910c"):
        c = Cluster(device=DEVICES[device_id], num_devices=4096)
        for size in (2, 8, 64, 512):
            rates = [group_link(c, EFF, size, stride).bytes_per_s for stride in (1, 2, 4, 8, 16)]
            assert all(a >= b for a, b in itertools.pairwise(rates)), (device_id, size)


def test_devices_per_node_widens_the_domain() -> None:
    c = Cluster(device=DEVICES["h100-sxm"], num_devices=64, devices_per_node=16)
    assert c.scale_up_domain == 16
    assert group_link(c, EFF, 16, 1).bytes_per_s == pytest.approx(H100_UP)


# ----------------------------------------------------------------------------- mesh topology


MI300X_LINK = 448e9 / 7  # one direct Infinity Fabric link, per direction


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_mesh_group_inside_node_scales_with_peers(n: int) -> None:
    """MI300X: a group of n uses its n − 1 direct links, (n − 1)/(domain − 1) of 448 GB/s."""
    lk = group_link(cluster("mi300x"), EFF, n, 1)
    expected = 448e9 * (n - 1) / 7 * UP_BUS
    assert lk.bytes_per_s == pytest.approx(expected)
    assert lk.bytes_per_s == pytest.approx((n - 1) * MI300X_LINK * UP_BUS)
    # All-reduce over TP = 2 moves at one link's rate.
    if n == 2:
        assert all_reduce_s(lk, 1e9) == pytest.approx(
            1e9 / (MI300X_LINK * UP_BUS) + 2 * 3.5e-6, rel=1e-12
        )


def test_mesh_group_bandwidth_per_device_spec() -> None:
    up = DEVICES["mi300x"].scale_up
    assert up.topology == "mesh"
    assert up.group_bytes_per_s(8) == pytest.approx(448e9)
    assert up.group_bytes_per_s(2) == pytest.approx(64e9)
    assert up.group_bytes_per_s(16) == pytest.approx(448e9)  # never above the aggregate
    switch = DEVICES["h100-sxm"].scale_up
    assert switch.group_bytes_per_s(2) == switch.group_bytes_per_s(8) == pytest.approx(450e9)


def test_mesh_group_spanning_nodes() -> None:
    """A full-node slice per domain: k = 8 members use all 7 links."""
    lk = group_link(cluster("mi300x"), EFF, 16, 1)
    assert lk.members_per_domain == 8
    assert lk.intra_bytes_per_s == pytest.approx(448e9 * UP_BUS)
    assert lk.bytes_per_s == pytest.approx(min(8 * H100_OUT, 448e9 * UP_BUS))


def test_mesh_group_spanning_nodes_with_partial_domains() -> None:
    """Four members per node (stride 2): their in-domain hops reach only the 3 direct
    links among them, the same rate as a 4-member group inside one node."""
    c = cluster("mi300x")
    inside = group_link(c, EFF, 4, 2)
    spanning = group_link(c, EFF, 8, 2)
    assert spanning.members_per_domain == 4
    assert inside.bytes_per_s == pytest.approx(3 * MI300X_LINK * UP_BUS)
    assert spanning.intra_bytes_per_s == pytest.approx(inside.bytes_per_s)
    assert spanning.bytes_per_s == pytest.approx(min(4 * H100_OUT, 3 * MI300X_LINK * UP_BUS))
    # The all-to-all's in-domain share (3 of 8 peers) moves at that rate too.
    intra = 3 / 8 * 1e9 / (3 * MI300X_LINK * UP_BUS)
    inter = 4 / 8 * 1e9 / H100_OUT
    assert all_to_all_s(spanning, 1e9) == pytest.approx(max(intra, inter) + 8e-6)


# ----------------------------------------------------------------------------- monotonicity


def _scaled(device: DeviceSpec, f: float) -> DeviceSpec:
    return device.model_copy(
        update={
            "scale_up": device.scale_up.model_copy(
                update={"bandwidth_gb_per_s": device.scale_up.bandwidth_gb_per_s * f}
            ),
            "scale_out": device.scale_out.model_copy(
                update={"bandwidth_gb_per_s": device.scale_out.bandwidth_gb_per_s * f}
            ),
        }
    )


@pytest.mark.parametrize("device_id", sorted(DEVICES))
def test_more_bandwidth_never_slower_for_any_group(device_id: str) -> None:
    base = DEVICES[device_id]
    fast = _scaled(base, 1.7)
    for size in (1, 2, 4, 8, 16, 32, 96):
        for stride in (1, 2, 4, 8, 64):
            slow_lk = group_link(Cluster(device=base, num_devices=1024), EFF, size, stride)
            fast_lk = group_link(Cluster(device=fast, num_devices=1024), EFF, size, stride)
            for fn in (all_reduce_s, all_gather_s, reduce_scatter_s, all_to_all_s, send_recv_s):
                assert fn(fast_lk, 1e8) <= fn(slow_lk, 1e8)
