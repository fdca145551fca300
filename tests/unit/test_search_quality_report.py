"""The search-quality report's measure of the published runs' own resolution
(benchmarks/search_quality.py): how far one layout's measured step time moves between
software releases."""

from __future__ import annotations

import pytest

from benchmarks.search_quality import release_spreads


def test_release_spread_is_slowest_over_fastest_across_releases() -> None:
    a, b, c = ("llama", "h100", 64, "tp4 pp8"), ("llama", "h100", 64, "tp2 pp4"), ("x",)
    found = release_spreads(
        [
            (a, "26.02", 20.2),
            (a, "26.04", 19.7),
            (a, "26.04", 20.0),  # a second row of one release counts its step, not a release
            (b, "26.02", 9.0),  # one release: no spread to speak of
            (b, "26.02", 9.9),
            (c, "25.09", 10.0),
        ]
    )
    assert set(found) == {a}
    spread, releases = found[a]
    assert spread == pytest.approx(20.2 / 19.7 - 1)
    assert releases == 2
