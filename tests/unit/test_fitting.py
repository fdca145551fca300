"""Error statistics, rank correlation, the bounded optimiser and the calibration vector
(issue 5; ``ndplan.core.fitting`` and ``ndplan.validation.CalibrationSpace``).

- ``ErrorStats`` against figures worked out by hand;
- ``spearman`` against ``scipy.stats.spearmanr`` on random data, ties included;
- ``coordinate_search`` finds the minimum of a bounded separable quadratic, never
  evaluates outside the bounds, clips a start outside them, is deterministic, and
  stops once a sweep gains less than its tolerance;
- ``prior_penalty`` by hand, and a prior pulls a flat coordinate to its centre;
- ``CalibrationSpace`` round-trips a vector → Calibration → ``start()`` vector, and the
  shipped calibration → ``start()`` → Calibration; every parameter it fits carries a
  prior whose centre lies inside its bounds.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from ndplan.adapters.devices.calibration import shipped_calibration
from ndplan.core.calibration import Calibration
from ndplan.core.fitting import (
    ErrorStats,
    Parameter,
    Prior,
    coordinate_search,
    prior_penalty,
    spearman,
)
from ndplan.validation import FAMILIES, CalibrationSpace

# --------------------------------------------------------------------------- ErrorStats


def test_error_stats_by_hand() -> None:
    # |e| = 0.05 0.1 0.2 0.3 → mean 0.1625, median (0.1 + 0.2)/2 = 0.15,
    # p90 (linear) at position 0.9·3 = 2.7 → 0.2 + 0.7·0.1 = 0.27;
    # signed sorted −0.2 −0.05 0.1 0.3 → median (−0.05 + 0.1)/2 = 0.025.
    s = ErrorStats.of([0.1, -0.2, 0.3, -0.05])
    assert s.count == 4
    assert s.mape == pytest.approx(0.1625)
    assert s.median == pytest.approx(0.15)
    assert s.p90 == pytest.approx(0.27)
    assert s.bias == pytest.approx(0.025)


def test_error_stats_odd_count_and_sign_of_bias() -> None:
    s = ErrorStats.of([-0.1, -0.3, 0.2])  # |e| 0.1 0.2 0.3; signed median −0.1
    assert (s.count, s.mape, s.median, s.bias) == (
        3,
        pytest.approx(0.2),
        pytest.approx(0.2),
        pytest.approx(-0.1),
    )
    assert s.p90 == pytest.approx(0.2 + 0.8 * 0.1)  # position 0.9·2 = 1.8
    single = ErrorStats.of([0.07])
    assert (single.mape, single.median, single.p90, single.bias) == pytest.approx(
        (0.07, 0.07, 0.07, 0.07)
    )


def test_error_stats_empty_is_nan_not_an_error() -> None:
    s = ErrorStats.of([])
    assert s.count == 0
    assert all(math.isnan(v) for v in (s.mape, s.median, s.p90, s.bias))


# --------------------------------------------------------------------------- spearman


@pytest.mark.parametrize("seed", range(12))
def test_spearman_matches_scipy_on_random_data(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    a = rng.normal(size=n)
    b = 0.6 * a + rng.normal(size=n)
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_spearman_matches_scipy_with_ties(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(4, 30))
    a = rng.integers(0, 5, size=n).astype(float)  # many ties
    b = (a + rng.integers(0, 3, size=n)).astype(float)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        pytest.skip("constant draw")
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


def test_spearman_edge_cases() -> None:
    assert spearman([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [3.0, 1.0, 0.5]) == pytest.approx(-1.0)
    assert spearman([1.0, 2.0, 3.0], [1.0, 4.0, 9.0]) == pytest.approx(1.0)  # monotone, not linear
    assert math.isnan(spearman([1.0], [2.0]))
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # a constant has no ranking


# --------------------------------------------------------------------------- coordinate_search


PARAMS = [Parameter("a", 0.0, 1.0), Parameter("b", -2.0, 2.0), Parameter("c", 0.5, 3.0)]


def _quadratic(target: np.ndarray, weights: np.ndarray, seen: list[np.ndarray] | None = None):
    def f(x: np.ndarray) -> float:
        if seen is not None:
            seen.append(np.array(x, copy=True))
        return float((weights * (x - target) ** 2).sum())

    return f


def test_coordinate_search_finds_the_minimum_of_a_separable_quadratic() -> None:
    target = np.array([0.3, -1.2, 2.1])
    x, best = coordinate_search(
        _quadratic(target, np.array([1.0, 4.0, 0.5])), np.array([0.9, 1.5, 0.6]), PARAMS
    )
    # golden section, 12 steps: the bracket shrinks to 0.618^13 ≈ 0.2 % of each range
    assert x == pytest.approx(target, abs=0.01)
    assert best == pytest.approx(0.0, abs=1e-3)
    assert best == pytest.approx(_quadratic(target, np.array([1.0, 4.0, 0.5]))(x))


def test_coordinate_search_respects_bounds() -> None:
    target = np.array([1.7, -5.0, 0.9])  # a and b lie outside their bounds
    seen: list[np.ndarray] = []
    x, _ = coordinate_search(
        _quadratic(target, np.ones(3), seen), np.array([0.5, 0.0, 2.0]), PARAMS
    )
    lows = np.array([p.low for p in PARAMS])
    highs = np.array([p.high for p in PARAMS])
    assert seen, "the objective was never called"
    for trial in seen:
        assert np.all(trial >= lows) and np.all(trial <= highs), trial
    assert x[0] == pytest.approx(1.0, abs=0.01)  # pinned near the upper bound
    assert x[1] == pytest.approx(-2.0, abs=0.02)  # pinned near the lower bound
    assert x[2] == pytest.approx(0.9, abs=0.01)
    assert np.all(x >= lows) and np.all(x <= highs)


def test_coordinate_search_clips_a_start_outside_the_bounds() -> None:
    seen: list[np.ndarray] = []
    target = np.array([0.5, 0.0, 1.0])
    x, _ = coordinate_search(
        _quadratic(target, np.ones(3), seen), np.array([5.0, -9.0, 0.0]), PARAMS, sweeps=1
    )
    assert seen[0] == pytest.approx([1.0, -2.0, 0.5])  # the first call is the clipped start
    assert x == pytest.approx(target, abs=0.01)


def test_coordinate_search_never_worsens_and_is_deterministic() -> None:
    def bumpy(x: np.ndarray) -> float:
        return float(np.sin(5 * x[0]) + (x[1] - 0.3) ** 2 + np.cos(3 * x[2]))

    start = np.array([0.2, 0.2, 1.0])
    x1, best1 = coordinate_search(bumpy, start, PARAMS)
    x2, best2 = coordinate_search(bumpy, start, PARAMS)
    assert best1 <= bumpy(start)
    assert best1 == best2 and np.array_equal(x1, x2)
    assert start == pytest.approx([0.2, 0.2, 1.0])  # the caller's start is not modified


def test_coordinate_search_stops_once_a_sweep_gains_less_than_the_tolerance() -> None:
    # Coupled coordinates: each sweep moves along the valley x0 = x1 by a shrinking step
    # towards a floor of 1, so without a tolerance all ten sweeps run and the relative
    # gains shrink.
    def valley(x: np.ndarray) -> float:
        return float(1 + (x[0] - x[1]) ** 2 * 50 + (x[0] + x[1] - 0.4) ** 2)

    start = np.array([0.9, -1.5, 1.0])
    heard: list[tuple[int, float]] = []
    params = PARAMS
    _, full = coordinate_search(
        valley, start, params, sweeps=10, on_sweep=lambda n, v: heard.append((n, v))
    )
    assert [n for n, _ in heard] == list(range(1, 11))
    assert all(b <= a for (_, a), (_, b) in itertools.pairwise(heard))
    gains = [(a - b) / a for (_, a), (_, b) in itertools.pairwise(heard)]
    assert gains[-1] < gains[0]
    tolerance = 0.5 * max(gains)  # stops once the gains fall below half the largest
    stopped: list[int] = []
    _, early = coordinate_search(
        valley,
        start,
        params,
        sweeps=10,
        tolerance=tolerance,
        on_sweep=lambda n, v: stopped.append(n),
    )
    assert len(stopped) < 10
    assert early >= full
    assert early == heard[len(stopped) - 1][1]  # the same path, cut short


def test_prior_penalty_by_hand() -> None:
    params = [
        Parameter("a", 0.0, 1.0, Prior(0.5, 0.25)),
        Parameter("b", -2.0, 2.0),  # no prior: free
        Parameter("c", 0.5, 3.0, Prior(1.0, 2.0)),
    ]
    # z_a = (0.0 - 0.5) / 0.25 = -2, z_c = (2.0 - 1.0) / 2 = 0.5 → 4 + 0.25
    assert prior_penalty(np.array([0.0, 1.7, 2.0]), params) == pytest.approx(4.25)
    assert prior_penalty(np.array([0.5, -2.0, 1.0]), params) == 0.0


def test_a_prior_holds_a_coordinate_the_objective_does_not_constrain() -> None:
    # The objective depends on a only; b is flat, so without a prior it stays at its start,
    # and with one it goes to the prior's centre.
    params = [Parameter("a", 0.0, 1.0), Parameter("b", 0.0, 10.0, Prior(3.0, 1.0))]

    def flat_in_b(x: np.ndarray) -> float:
        return float((x[0] - 0.2) ** 2)

    x, _ = coordinate_search(flat_in_b, np.array([0.9, 8.0]), params)
    assert x[1] == 8.0
    x, _ = coordinate_search(
        lambda x: flat_in_b(x) + 0.01 * prior_penalty(x, params), np.array([0.9, 8.0]), params
    )
    assert x == pytest.approx([0.2, 3.0], abs=0.02)


# --------------------------------------------------------------------------- CalibrationSpace

ALL_FAMILIES = sorted(set(FAMILIES.values()))


@pytest.mark.parametrize("families", [ALL_FAMILIES, ["hopper"], ["ampere", "blackwell"]])
@pytest.mark.parametrize("seed", range(3))
def test_calibration_space_round_trips_a_vector(families: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)
    space = CalibrationSpace(Calibration(), families)
    lows = np.array([p.low for p in space.params])
    highs = np.array([p.high for p in space.params])
    x = rng.uniform(lows, highs)
    cal = space.calibration(x, rows=7.0)
    again = Calibration.model_validate_json(cal.model_dump_json())  # a valid calibration file
    assert again == cal
    assert again.fit == {"rows": 7.0}
    back = CalibrationSpace(again, families).start()
    assert back == pytest.approx(x, rel=1e-12, abs=1e-15)
    names = [p.name for p in space.params]
    assert len(set(names)) == len(names)
    # every device id of a fitted generation prices with that generation's factors
    for device_id, fam in FAMILIES.items():
        if fam in families:
            assert again.families[device_id] == fam
            assert again.devices[fam].gemm == pytest.approx(x[names.index(f"{fam}.gemm")])


@pytest.mark.parametrize(
    ("field", "families_arg"), [("gemm_fp4", "fp4_families"), ("gemm_mxfp8", "mxfp8_families")]
)
def test_low_precision_recipe_efficiency_is_fitted_only_where_its_rows_are(
    field: str, families_arg: str
) -> None:
    space = CalibrationSpace(
        Calibration(), ["hopper", "blackwell"], **{families_arg: ["blackwell"]}
    )
    names = [p.name for p in space.params]
    assert f"blackwell.{field}" in names and f"hopper.{field}" not in names
    start = dict(zip(names, space.start(), strict=True))
    # Not fitted yet: the recipe's efficiency starts where the per-tensor fp8 one is.
    assert start[f"blackwell.{field}"] == Calibration().default.gemm_low_precision
    x = space.start()
    x[names.index(f"blackwell.{field}")] = 0.3
    cal = space.calibration(x)
    assert getattr(cal.devices["blackwell"], field) == 0.3
    assert getattr(cal.devices["hopper"], field) is None
    assert getattr(cal.default, field) == 0.3  # the mean of the fitted generations
    # A calibration that has it is refitted with it.
    assert f"blackwell.{field}" in [p.name for p in CalibrationSpace(cal, ["blackwell"]).params]


def test_bf16_expert_efficiency_is_fitted_only_where_bf16_moe_rows_are() -> None:
    space = CalibrationSpace(Calibration(), ["hopper", "ampere"], grouped_bf16_families=["hopper"])
    names = [p.name for p in space.params]
    assert "hopper.grouped_gemm_bf16" in names and "ampere.grouped_gemm_bf16" not in names
    start = dict(zip(names, space.start(), strict=True))
    assert start["hopper.grouped_gemm_bf16"] == Calibration().default.gemm  # starts at bf16's
    x = space.start()
    x[names.index("hopper.grouped_gemm_bf16")] = 0.35
    cal = space.calibration(x)
    assert cal.devices["hopper"].grouped_gemm_bf16 == 0.35
    assert cal.devices["ampere"].grouped_gemm_bf16 is None


def test_fp8_share_never_exceeds_bf16s() -> None:
    """The fit moves fp8's share of its peak as a ratio to bf16's, at most 1."""
    space = CalibrationSpace(Calibration(), ["blackwell"])
    names = [p.name for p in space.params]
    ratio = space.params[names.index("blackwell.low_precision_ratio")]
    assert ratio.high == 1.0
    x = space.start()
    x[names.index("blackwell.gemm")] = 0.4
    x[names.index("blackwell.low_precision_ratio")] = 1.0
    eff = space.calibration(x).devices["blackwell"]
    assert eff.gemm_low_precision == pytest.approx(0.4)


def test_calibration_space_start_reads_the_base() -> None:
    base = Calibration()
    space = CalibrationSpace(base, ["hopper"])
    start = dict(zip((p.name for p in space.params), space.start(), strict=True))
    assert start["hopper.gemm"] == base.default.gemm  # no hopper entry → the default
    assert start["shared.hbm"] == base.default.hbm
    assert start["overlap.megatron.dp"] == base.overlap_for("megatron").dp
    assert start["attention_scale.megatron"] == 1.0
    assert start["step_overhead_s"] == 0.0


def test_shipped_calibration_is_a_point_of_its_own_space() -> None:
    """start() of the shipped file, turned back into a Calibration, prices identically."""
    shipped = shipped_calibration()
    families = [f for f in shipped.devices if f in set(FAMILIES.values())]
    assert sorted(families) == ALL_FAMILIES
    space = CalibrationSpace(shipped, families)
    x = space.start()
    lows = np.array([p.low for p in space.params])
    highs = np.array([p.high for p in space.params])
    assert np.all(x >= lows) and np.all(x <= highs), "shipped values outside the fit's bounds"
    rebuilt = space.calibration(x, **shipped.fit)
    assert rebuilt.model_dump(exclude={"source"}) == shipped.model_dump(exclude={"source"})


def _row(
    row_id: int, layout: str, gbs: int, measured_s: float, predicted_s: float, release: str = ""
):
    from ndplan.validation import RowResult

    return RowResult(
        row_id=row_id,
        source="s",
        model="m",
        family="llama",
        hardware="h100-sxm",
        num_devices=64,
        tokens_per_step=gbs * 4096,
        layout=layout,
        moe=False,
        check=False,
        measured_s=measured_s,
        predicted_s=predicted_s,
        fits=True,
        predicted_peak_gib=60.0,
        measured_peak_gib=None,
        step_from="tokens",
        release=release,
    )


def test_ranking_groups_compare_throughput_not_step_time() -> None:
    """Row 3 runs twice the batch: by tokens/s the measured order is 1 > 3 > 2 and the
    predicted 3 > 1 > 2 (ρ = 0.5); ranking by step time would call both 1 > 2 > 3 (ρ = 1)."""
    from ndplan.validation import ranking_groups

    rows = [
        _row(1, "tp1 pp1 cp1 dp64 mbs1 z1", 128, 1.0, 1.00),
        _row(2, "tp2 pp1 cp1 dp32 mbs1 z1", 128, 1.1, 1.05),
        _row(3, "tp4 pp1 cp1 dp16 mbs1 z1", 256, 2.1, 1.90),
    ]
    (group,) = ranking_groups(rows)
    assert group["layouts"] == 3
    assert group["spearman"] == pytest.approx(0.5)
    assert group["measured_best_in_top3"]


def test_ranking_groups_count_the_releases_their_rows_span() -> None:
    """A group mixing software releases compares their speed-ups too: it says how many."""
    from ndplan.validation import ranking_groups

    rows = [
        _row(1, "tp1 pp1 cp1 dp64 mbs1 z1", 128, 1.0, 1.0, "25.11"),
        _row(2, "tp1 pp1 cp1 dp64 mbs1 z1", 128, 0.8, 1.0, "26.02"),
        _row(3, "tp2 pp1 cp1 dp32 mbs1 z1", 128, 0.9, 1.1, "26.02"),
    ]
    (group,) = ranking_groups(rows)
    assert group["releases"] == 2
    (alone,) = ranking_groups([replace(r, release="26.02") for r in rows])
    assert alone["releases"] == 1


def test_ranking_groups_need_two_layouts() -> None:
    from ndplan.validation import ranking_groups

    same = [_row(i, "tp1 pp1 cp1 dp64 mbs1 z1", 128, 1.0 + i / 10, 1.0) for i in range(4)]
    assert ranking_groups(same) == []


def test_every_fitted_parameter_has_a_prior_inside_its_bounds() -> None:
    space = CalibrationSpace(
        Calibration(),
        ALL_FAMILIES,
        fp4_families=ALL_FAMILIES,
        grouped_bf16_families=ALL_FAMILIES,
        mxfp8_families=ALL_FAMILIES,
    )
    for p in space.params:
        assert p.prior is not None, p.name
        assert p.low <= p.prior.centre <= p.high, p.name
        assert p.prior.width > 0, p.name


# --------------------------------------------------------------------------- the two-stage fit


def test_dense_rows_fit_the_shared_kernels_and_moe_rows_only_what_moe_layers_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stage 1 prices only the dense rows; stage 2 only the MoE rows and moves only the
    MoE-only parameters, so a MoE residual cannot reach a dense GEMM's efficiency."""
    from pathlib import Path

    from ndplan import validation
    from ndplan.adapters.measured import RunInterpreter, read_rows
    from ndplan.planner import Planner

    runs = Path(__file__).resolve().parents[1] / "data" / "shared" / "measured_runs.csv"
    planner = Planner()
    wanted = {34, 36, 74, 78, 8, 10, 44}  # Llama on GB200/GB300; Qwen3 and GPT-OSS MoE
    rows = [r for r in read_rows(runs) if int(r["row_id"]) in wanted]
    cases, _ = RunInterpreter(planner.components.presets, planner.components.devices).interpret_all(
        rows
    )
    dense = {c.row_id for c in cases if not c.moe}
    moe = {c.row_id for c in cases if c.moe}
    assert dense and moe

    def watched(cal: Calibration) -> tuple[float, ...]:
        """Figures only dense-layer kernels read, then figures only MoE layers read."""
        return (
            cal.devices["blackwell"].gemm,
            cal.devices["blackwell-ultra"].attention,
            cal.default.scale_up_bus,
            cal.overlap_for("megatron").tp,
        ), (
            cal.default.moe_layer_overhead_us,
            cal.default.grouped_gemm_half_gflop,
            cal.default.grouped_gemm_saturation_tokens,
            cal.default.grouped_gemm_low_precision_ratio,
            cal.overlap_for("megatron").ep,
        )

    calls: list[tuple[frozenset[int], tuple, tuple]] = []
    real_compare = validation.compare

    def compare(planner, cases, calibration):
        cases = list(cases)
        calls.append((frozenset(c.row_id for c in cases), *watched(calibration)))
        return real_compare(planner, cases, calibration)

    monkeypatch.setattr(validation, "compare", compare)
    fitted, results = validation.fit_calibration(planner, cases, Calibration(), sweeps=1)

    phases = [rows for rows, _, _ in calls]
    first_moe = phases.index(frozenset(moe))
    assert all(rows == frozenset(dense) for rows in phases[:first_moe])
    assert all(rows == frozenset(moe) for rows in phases[first_moe:-1])
    assert phases[-1] == frozenset(dense | moe)  # the report prices every row
    # Stage 1 leaves the MoE-only figures where they started ...
    assert len({m for _, _, m in calls[:first_moe]}) == 1
    # ... stage 2 moves only them: the dense figures stay at stage 1's result.
    dense_figures, moe_figures = watched(fitted)
    assert {d for _, d, _ in calls[first_moe:]} == {dense_figures}
    assert len({m for _, _, m in calls[first_moe:]}) > 1
    assert moe_figures != calls[0][2]
    assert len(results) == len(cases)
