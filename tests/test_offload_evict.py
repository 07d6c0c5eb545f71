"""The CPU tier's eviction on a hand-built tier (ext/offload_lru.pxi ``_off_evict``, through the
hook ``_evict_probe``): LRUCachePolicy.evict takes the evictable, unprotected chunks of lowest rank,
head of the list first, or none when there are not enough; the chunks it takes leave the list a
stretch of consecutive nodes at a time and leave the key map by backward-shift deletion.
"""

import random

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
