"""``sampling.median_interval``: order statistics whose coverage of the median is exact (binomial)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cotsdl.bench.sampling import median_interval


def _coverage(n: int, j: int) -> float:
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0 ** n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60), st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]))
def test_the_interval_holds_the_median_and_is_the_narrowest_with_its_coverage(values, level):
    lo, hi, cov = median_interval(values, level)
    a, n = sorted(values), len(values)
    assert lo <= float(np.median(values)) <= hi
    js = [k for k in range(1, (n + 1) // 2 + 1) if _coverage(n, k) >= level]
    want = max(js) if js else 1  # the innermost pair of order statistics that still covers `level`
    assert cov == pytest.approx(_coverage(n, want)) and (cov >= level or want == 1)
    assert (lo, hi) == (a[want - 1], a[n - want])


def test_known_sizes():
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0, 6.0]) == (1.0, 6.0, pytest.approx(1 - 2 / 64))
    assert median_interval(range(10))[:2] == (1.0, 8.0)  # n = 10: x(2), x(9), 97.9%
    assert median_interval([7.0])[:2] == (7.0, 7.0)
    with pytest.raises(ValueError, match="finite"):
        median_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        median_interval([])
