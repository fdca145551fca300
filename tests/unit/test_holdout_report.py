"""The leave-one-source-out report (benchmarks/holdout.py): each fold fits on the other
sources' even rows only and prices every row of the source it left out."""

from __future__ import annotations

import math

import pytest

import benchmarks.holdout as holdout


def test_a_fold_never_fits_on_the_source_it_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_fit(planner, cases, base, *, source):
        seen["train"] = list(cases)
        return base, []

    monkeypatch.setattr(holdout, "fit_calibration", fake_fit)
    source, errors = holdout.held_out_errors("nemo-cp")
    train = seen["train"]
    assert source == "nemo-cp"
    assert train and all(c.source != "nemo-cp" and c.row_id % 2 == 0 for c in train)
    assert {c.source for c in train} >= {"megatron-bridge", "llm-foundry", "nemo"}
    cases = holdout._cases(holdout.Planner())
    held = {c.row_id for c in cases if c.source == "nemo-cp"}
    # Every row of the held-out source, the fit's odd and even rows alike, is priced.
    assert set(errors) == held and any(i % 2 == 0 for i in held) and any(i % 2 for i in held)
    assert all(math.isfinite(e) for e in errors.values())
