"""The CPU tier's eviction on a hand-built tier (ext/offload_lru.pxi ``_off_evict``, through the
hook ``_evict_probe``): LRUCachePolicy.evict takes the evictable, unprotected chunks of lowest rank,
head of the list first, or none when there are not enough; the chunks it takes leave the list a
stretch of consecutive nodes at a time and leave the key map by backward-shift deletion.
"""

import random

import pytest

from aisim._core.scheduler import _evict_probe

# Eight chunks, the list head first; chunk k holds key 100 + k.
ORDER = [5, 4, 3, 2, 1, 0, 7, 6]
KEYS = [100 + c for c in ORDER]


def test_eviction_skips_pinned_and_protected_chunks_in_three_stretches():
    # 3 is pinned (not evictable), 1 protected: four chunks from the head are 5, 4, 2 and 0, three
    # stretches of the list ([5, 4], [2], [0]); 2 is private (never in the map).
    done, ahead, back, freed, found = _evict_probe(8, ORDER, KEYS, {3}, {1}, {2}, 4)
    assert done == 1
    assert ahead == [3, 1, 7, 6]
    assert back == [6, 7, 1, 3]
    assert freed == [5, 4, 2, 0]
    assert found == [-1, -1, 3, -1, 1, -1, 7, 6]


def test_eviction_of_a_whole_stretch_up_to_the_tail():
    done, ahead, back, freed, found = _evict_probe(8, ORDER, KEYS, set(), set(), set(), 8)
    assert (done, ahead, back, freed) == (1, [], [], ORDER)
    assert found == [-1] * 8


def test_eviction_without_enough_candidates_changes_nothing():
    # Six candidates (3 pinned, 1 protected) for seven: LRUCachePolicy.evict returns None.
    done, ahead, back, freed, found = _evict_probe(8, ORDER, KEYS, {3}, {1}, set(), 7)
    assert (done, ahead, back, freed) == (0, ORDER, ORDER[::-1], [])
    assert found == ORDER


def test_the_key_map_keeps_every_other_key_through_deletions():
    # 64 chunks in a map of 128 buckets, keys drawn at random (clusters form and wrap around): after
    # the 40 chunks at the head go, the other 24 keys are still found in their chunks.
    rnd = random.Random(7)
    order = list(range(64))
    rnd.shuffle(order)
    keys = [rnd.getrandbits(64) for _ in order]
    done, ahead, back, freed, found = _evict_probe(64, order, keys, set(), set(), set(), 40)
    assert (done, ahead, back, freed) == (1, order[40:], order[40:][::-1], order[:40])
    assert found == [-1] * 40 + order[40:]


def _runs_order(rnd, n_chunks):
    # A list order made of runs of descending chunk indices (what stores leave behind: the walk's
    # likely way) cut at random points and shuffled, so that the walk's guess holds and breaks.
    order = list(range(n_chunks - 1, -1, -1))
    cuts = sorted(rnd.sample(range(1, n_chunks), 12))
    runs = [order[a:b] for a, b in zip([0] + cuts, cuts + [n_chunks])]
    rnd.shuffle(runs)
    return [c for run in runs for c in run]


def test_eviction_over_descending_runs_takes_the_lowest_ranked_candidates():
    # The walk guesses the node below the one it visits: over runs of descending indices (guess
    # right) broken at random (guess wrong), with pinned and protected chunks among them, it takes
    # exactly the first n candidates in list order, as a plain walk of the list does.
    rnd = random.Random(11)
    for n_chunks in (40, 97, 300):
        order = _runs_order(rnd, n_chunks)
        keys = [rnd.getrandbits(64) for _ in order]
        pinned = set(rnd.sample(order, n_chunks // 10))
        protected = set(rnd.sample([c for c in order if c not in pinned], n_chunks // 10))
        candidates = [c for c in order if c not in pinned and c not in protected]
        n = len(candidates) * 2 // 3
        done, ahead, back, freed, found = _evict_probe(n_chunks, order, keys, pinned, protected, set(), n)
        kept = [c for c in order if c not in candidates[:n]]
        assert (done, freed, ahead, back) == (1, candidates[:n], kept, kept[::-1])
        assert found == [-1 if c in candidates[:n] else c for c in order]


@pytest.mark.parametrize("watched, n, dropped", [
    ([6, 7], 4, False),          # the scan's chunks lie past the four evicted ones: kept
    ([6, 7], 7, True),           # the seventh evicted is 7 (in the key map): dropped
    ([2], 4, True),              # 2 (out of the key map) among the four evicted: dropped
    ([1, 0, 7, 6, 2], 3, False), # none of them among the three evicted: kept
    ([1, 0, 7, 6, 4], 2, True),  # 4 among the two evicted: dropped
])
def test_evicting_a_chunk_the_kept_scan_found_drops_the_scan(watched, n, dropped):
    # The last lookup's scan is kept while none of the chunks it found changes: evicting one of
    # them forgets it (every found chunk unwatched), evicting others keeps it.
    done, ahead, back, freed, found, on, watch = _evict_probe(8, ORDER, KEYS, set(), set(), {2}, n, watched)
    assert done == 1 and freed == ORDER[:n]
    assert on == (not dropped)
    assert watch == [0 if dropped else 1] * len(watched)
