"""The interference probe's inversion: times made by the two-way slowdown model give back its factors."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("times", "factors"),
    [
        # comm 100, compute 50 slowed 1.5x ends at 75; comm at half speed meanwhile (37.5 done), the rest by 137.5
        ((100.0, 50.0, 75.0, 137.5), (1.5, 2.0)),
        # compute outlasts comm (150 vs 100, 1.2x while comm runs): both end at 166.67, and g cannot be seen
        ((100.0, 150.0, 500.0 / 3.0, 500.0 / 3.0), (1.2, None)),
        # no overlap at all: the serial sum
        ((100.0, 50.0, 50.0, 150.0), (1.0, 4.0)),
    ],
)
def test_interference_factors_invert_the_model(times, factors):
    from commsched.runtime.measure import interference_factors

    assert interference_factors(*times) == pytest.approx(factors)
