"""Deferred keys in the block pool: a run of blocks deferred in one call, evicted and keyed.

A block deferred on a node (ext/blockpool.pyx ``bp_defer_run``) is cached in every way the free
queue and the counts see, its key outside the map on its node's list in caching order; popping it
evicts it from that list wherever it sits (head, middle or tail), ``bp_materialize`` keys the whole
list in order, ``bp_key_deferred`` one block.  Expected block ids, queue orders and lookups are
derived by hand from vLLM's free-queue rules (``FreeKVCacheBlockQueue``: pops from the head, a
cached freed block appended to the tail, an uncached one prepended) and ``BlockHashToBlockMap``
(a key's lookup returns its earliest inserted block); each holds for both ways of popping
(a map within or past the near caches, ``BlockPoolC.far_map``).
"""

import pytest

from aisim._core.testing import BlockPool


@pytest.mark.parametrize("far_map", [False, True])
def test_a_run_deferred_then_evicted_tail_first_and_materialized(far_map):
    pool = BlockPool(10, far_map=far_map)
    pool.nodes(3)
    assert pool.get_new_blocks(6) == [1, 2, 3, 4, 5, 6]
    # Block k of a run covers num_tokens + k * block_size tokens; the null entry is skipped.
    pool.defer_run([1, 2, 0, 3], [11, 12, 0, 13], 16, 16, 2)
    assert pool.deferred(2) == [1, 2, 3]
    assert [pool.key_tokens(b) for b in (1, 2, 3)] == [16, 32, 64]
    assert [pool.block_key(b) for b in (1, 2, 3)] == [11, 12, 13]
    assert pool.lookup(11) is None  # outside the map
    assert pool.cached_free == 0  # all held
    # A second run on the same node goes after the first; keep 0 leaves block 5 uncached.
    pool.defer_run([4, 5, 6], [14, 15, 16], 80, 16, 2, keep=[1, 0, 1])
    assert pool.deferred(2) == [1, 2, 3, 4, 6]
    assert pool.block_key(5) == 0
    assert (pool.key_tokens(4), pool.key_tokens(6)) == (80, 112)
    assert pool.deferred(0) == [] and pool.deferred(1) == []
    # The request's table freed tail first: the uncached block 5 to the head, the others to the tail.
    pool.free_blocks([6, 5, 4, 3, 2, 1])
    assert pool.free_queue() == [5, 7, 8, 9, 6, 4, 3, 2, 1]
    assert pool.cached_free == 5
    # Popping five takes block 6 off the list's tail: an eviction with no map entry.
    assert pool.get_new_blocks(5) == [5, 7, 8, 9, 6]
    assert pool.deferred(2) == [1, 2, 3, 4]
    assert (pool.evictions, pool.cached_free, pool.block_key(6)) == (1, 4, 0)
    pool.materialize(2)
    assert pool.deferred(2) == []
    assert [pool.lookup(k) for k in (11, 12, 13, 14, 16)] == [1, 2, 3, 4, None]
    # Now a map key: popping block 4 drops it from the map.
    assert pool.get_new_blocks(1) == [4]
    assert pool.lookup(14) is None
    assert (pool.evictions, pool.cached_free) == (2, 3)
    assert pool.free_queue() == [3, 2, 1]


@pytest.mark.parametrize("far_map", [False, True])
def test_evictions_from_the_middle_head_and_tail_of_two_nodes_lists(far_map):
    pool = BlockPool(8, far_map=far_map)
    pool.nodes(2)
    assert pool.get_new_blocks(7) == [1, 2, 3, 4, 5, 6, 7]
    pool.defer_run([1, 2, 3], [21, 22, 23], 16, 16, 0)
    pool.defer_run([4, 5], [24, 25], 16, 16, 1)
    pool.defer_run([6, 7], [26, 27], 48, 16, 0)
    assert pool.deferred(0) == [1, 2, 3, 6, 7]
    assert pool.deferred(1) == [4, 5]
    pool.free_blocks([3, 1, 7, 2, 6, 4, 5])  # every block has a key: appended in this order
    assert pool.free_queue() == [3, 1, 7, 2, 6, 4, 5]
    assert pool.get_new_blocks(1) == [3]  # the middle of node 0's list
    assert pool.deferred(0) == [1, 2, 6, 7]
    assert pool.get_new_blocks(1) == [1]  # its head
    assert pool.deferred(0) == [2, 6, 7]
    assert pool.get_new_blocks(1) == [7]  # its tail
    assert pool.deferred(0) == [2, 6]
    pool.key_deferred(6)  # one block keyed on its own (a preemption): into the map, off the list
    assert pool.deferred(0) == [2]
    assert pool.lookup(26) == 6
    assert pool.get_new_blocks(2) == [2, 6]  # the last deferred block, then a map key
    assert pool.deferred(0) == []
    assert pool.lookup(26) is None
    assert pool.evictions == 5
    assert pool.deferred(1) == [4, 5]  # the other node's list untouched
    assert pool.get_new_blocks(1) == [4]
    assert pool.deferred(1) == [5]
    assert (pool.evictions, pool.cached_free, pool.free_queue()) == (6, 1, [5])


@pytest.mark.parametrize("far_map", [False, True])
def test_materialized_keys_follow_a_key_already_in_the_map(far_map):
    pool = BlockPool(6, far_map=far_map)
    pool.nodes(1)
    assert pool.get_new_blocks(3) == [1, 2, 3]
    pool.cache_block(2, 31)
    pool.defer_run([3, 1], [31, 32], 16, 16, 0)
    assert pool.deferred(0) == [3, 1]
    pool.materialize(0)
    # Block 2 was inserted under 31 first: the lookup returns it while it is cached.
    assert (pool.lookup(31), pool.lookup(32)) == (2, 1)
    pool.free_blocks([2])
    assert pool.free_queue() == [4, 5, 2]
    assert pool.get_new_blocks(3) == [4, 5, 2]
    assert pool.lookup(31) == 3


def test_defer_run_checks_its_arguments():
    pool = BlockPool(4)
    pool.nodes(1)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError):
        pool.defer_run([3], [1], 16, 16, 0)  # block 3 is free
    with pytest.raises(ValueError):
        pool.defer_run([1], [1], 16, 16, 1)  # no node 1
    with pytest.raises(ValueError):
        pool.defer_run([1, 2], [1], 16, 16, 0)  # one key short
    with pytest.raises(ValueError):
        pool.key_deferred(1)  # not deferred
