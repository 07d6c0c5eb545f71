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


def test_tally_merges_as_a_stable_sort_would():
    from aisim.stats import Tally, weighted_stats

    # Gaps and counts in the order recorded: equal gaps' counts add up (0.25: 2 + 5 + 1 = 8).
    tally = Tally()
    tally.add(np.array([0.5, 0.25, 0.75, 0.25]), np.array([3, 2, 4, 5]))
    tally.add(np.array([0.25, 0.125]), np.array([1, 6]))
    values, counts = tally.pairs()
    assert values.tolist() == [0.125, 0.25, 0.5, 0.75] and counts.tolist() == [6, 8, 3, 4]
    # 0.0 and -0.0 are one gap, kept as the first given; each NaN is a gap of its own, in the order given.
    for first, second in ((-0.0, 0.0), (0.0, -0.0)):
        tally = Tally()
        tally.add(np.array([np.nan, 1.0, first, np.nan, second]), np.array([1, 2, 3, 4, 5]))
        values, counts = tally.pairs()
        assert np.signbit(values[0]) == np.signbit(first) and values[0] == 0.0
        assert values[1] == 1.0 and np.isnan(values[2:]).all() and counts.tolist() == [8, 2, 1, 4]
    tally = Tally()
    tally.add(np.array([1.0, -0.0, 0.0, 2.0]), np.array([1, 2, 3, 4]))
    values, counts = tally.pairs()
    assert np.signbit(values[0]) and values.tolist() == [0.0, 1.0, 2.0] and counts.tolist() == [5, 1, 4]
    # Long enough for numpy's default sort to move equal values: the same runs as a stable sort's.
    v = np.concatenate([np.where(np.arange(600) % 2 == 0, -0.0, 0.0), np.full(300, np.nan), np.arange(1.0, 301.0)])
    tally = Tally()
    tally.add(v, np.arange(1, 1201))
    values, counts = tally.pairs()
    assert np.signbit(values[0]) and values[0] == 0.0 and counts[0] == 600 * 601 // 2
    assert values[1:301].tolist() == list(range(1, 301)) and counts[1:301].tolist() == list(range(901, 1201))
    assert np.isnan(values[301:]).all() and counts[301:].tolist() == list(range(601, 901))
    # Pairs merged already (each gap once, ascending) are kept as given; the statistics read them unsorted.
    values, counts = np.array([0.0, 1.0, 2.0]), np.array([5, 1, 4])
    merged = Tally()
    merged.add(values, counts)
    assert merged.pairs()[0] is values and merged.pairs()[1] is counts and merged.n == 10
    assert weighted_stats(values, counts, (50, 90)) == (0.9, 0.5, 0.9433981132056605, [0.5, 2.0])


def test_tally_pairs_equal_a_stable_sort_and_sum():
    from aisim.stats import Tally

    def reference(v, c):  # the merge as a stable sort then a sum over each run of equal values
        order = np.argsort(v, kind="stable")
        v, c = v[order], c[order]
        starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1])))
        return v[starts], np.add.reduceat(c, starts)

    rng = np.random.default_rng(11)
    gaps = 0.001 + np.round(rng.exponential(0.05, 5000), 4)  # repeats, as a replay's gaps have
    cases = [
        (gaps, rng.integers(1, 60, 5000)),                         # one 64-bit key a pair
        (gaps, rng.integers(1, 2**40, 5000)),                      # counts too wide for a key: argsort
        (np.concatenate([gaps, [1e-300, 1e300, np.inf, 0.0]]), rng.integers(1, 9, 5004)),  # span too wide
        (np.concatenate([gaps, [-0.0, 0.0, np.nan, -1.5]]), rng.integers(1, 9, 5004)),     # the stable sort
    ]
    for v, c in cases:
        tally = Tally()
        tally.add(v[:3000], c[:3000])
        tally.add(v[3000:], c[3000:])
        values, counts = tally.pairs()
        ref_v, ref_c = reference(v, c)
        assert values.tobytes() == ref_v.tobytes() and counts.tobytes() == ref_c.tobytes()
