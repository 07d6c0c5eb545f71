"""aisim.stats.percentiles equals np.percentile bit for bit (the replay summary's p50/p90/p99 use it)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aisim.stats import percentiles

QS = (0, 1, 25, 50, 90, 99, 99.9, 100)


def test_hand_computed_values():
    # n = 5: index (n - 1) q / 100; p90 = 3.6 -> 40 + 0.6 * (50 - 40), taken from the upper end.
    assert percentiles(np.array([50.0, 10.0, 40.0, 20.0, 30.0]), (0, 50, 90, 100)) == [10.0, 30.0, 46.0, 50.0]
    assert percentiles(np.array([7]), (50, 99)) == [7.0, 7.0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), min_size=1, max_size=60)
       | st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=60))
def test_equal_to_numpy(values):
    v = np.array(values)
    assert percentiles(v, QS) == [float(x) for x in np.percentile(v, QS)]
