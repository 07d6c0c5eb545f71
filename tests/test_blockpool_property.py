"""Property tests: aisim's Cython ``BlockPool`` against a pure-Python reference.

The reference (``RefBlockPool``) restates spec /work/shared/spec/vllm-kv-cache.md
§1.2 and §3.1 as directly as possible (vLLM ``vllm/v1/core/block_pool.py``):

* block 0 is the null block: never in the free queue, never counted;
* the free queue starts as ``1 .. N-1``; ``get_new_blocks(n)`` pops from the
  head and evicts every popped block's key (lazy eviction);
* ``touch`` unlinks ref-count-0 blocks from wherever they sit, then ref += 1;
* ``free_blocks(ordered)`` decrements; blocks reaching 0 without a key (or any
  block with caching off) are prepended to the head in the given order, cached
  ones appended to the tail in the given order;
* the key map never de-duplicates: key -> blocks in insertion order, and a
  lookup returns the earliest inserted block still cached.

A hypothesis state machine drives both pools with the same random operations
and compares every observable after each step.
"""

import math

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aisim._core.testing import BlockPool

# A small key pool so that duplicate keys (several blocks under one key) happen
# often.  The values also collide in the low bits (the C map indexes its
# open-addressing table by ``key & mask``, mask + 1 <= 1024 for the pools used
# here), and the top values sit in the last slot so probing wraps around.
KEY_POOL = [
    1,
    2,
    1 + 1024,
    2 + 1024,
    2**64 - 1,
    2**64 - 1 - 1024,
]


class RefBlockPool:
    """Pure-Python reference block pool (spec §1.2, §3.1)."""

    def __init__(self, num_blocks, enable_caching=True):
        self.num_blocks = num_blocks
        self.caching = enable_caching
        self.queue = list(range(1, num_blocks))  # head .. tail; null block 0 excluded
        self.ref = [0] * num_blocks
        self.key = [0] * num_blocks  # 0 = uncached
        self.map = {}  # key -> [block ids in insertion order]
        self.evictions = 0  # blocks whose key was dropped when popped for reuse

    @property
    def num_free(self):
        return len(self.queue)

    @property
    def usage(self):
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def _evict(self, b):
        k = self.key[b]
        blocks = self.map[k]
        blocks.remove(b)
        if not blocks:
            del self.map[k]
        self.key[b] = 0

    def get_new_blocks(self, n):
        if n < 0 or n > self.num_free:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        out = []
        for _ in range(n):
            b = self.queue.pop(0)
            if self.key[b]:
                self._evict(b)
                self.evictions += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks):
        for b in blocks:
            if b == 0:
                continue
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1

    def free_blocks(self, ordered):
        front, back = [], []
        for b in ordered:
            if b == 0:
                continue
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] == 0 or not self.caching:
                    front.append(b)
                else:
                    back.append(b)
        self.queue = front + self.queue + back

    def cache_block(self, b, key):
        assert self.key[b] == 0 and key != 0
        self.key[b] = key
        self.map.setdefault(key, []).append(b)

    def lookup(self, key):
        blocks = self.map.get(key)
        return blocks[0] if blocks else None

    def check_invariants(self):
        # Spec §1.8: a block is in the free queue iff ref 0 and not null.
        assert 0 not in self.queue
        assert len(set(self.queue)) == len(self.queue)
        assert set(self.queue) == {b for b in range(1, self.num_blocks) if self.ref[b] == 0}
        # A cached block is in the map under its key; an uncached one nowhere.
        listed = [b for blocks in self.map.values() for b in blocks]
        assert len(listed) == len(set(listed))
        assert set(listed) == {b for b in range(self.num_blocks) if self.key[b]}
        for k, blocks in self.map.items():
            assert blocks and all(self.key[b] == k for b in blocks)


# ---------------------------------------------------------------- state machine


@settings(max_examples=200, deadline=None, stateful_step_count=60)
class BlockPoolMachine(RuleBasedStateMachine):
    """Drive ``BlockPool`` and ``RefBlockPool`` with identical operations."""

    def __init__(self):
        super().__init__()
        self.pool = None
        self.ref = None
        # One entry per reference a "request" holds (a block held twice appears twice).
        self.held = []

    @initialize(
        num_blocks=st.one_of(st.integers(min_value=2, max_value=14), st.integers(min_value=15, max_value=40)),
        caching=st.sampled_from([True, True, True, False]),  # mostly caching on
        # Both ways of popping the free queue: a map within the near caches, and one past them (a
        # pool of over 8,192 blocks takes that path; forced here on small pools).
        far=st.booleans(),
    )
    def init_pools(self, num_blocks, caching, far):
        self.pool = BlockPool(num_blocks, enable_caching=caching, far_map=far)
        self.ref = RefBlockPool(num_blocks, enable_caching=caching)
        self.held = []

    # -- operations

    @rule(data=st.data())
    def allocate(self, data):
        n = data.draw(st.integers(min_value=0, max_value=self.ref.num_free), label="n")
        got = self.pool.get_new_blocks(n)
        want = self.ref.get_new_blocks(n)
        assert got == want
        self.held.extend(got)

    @precondition(lambda self: self.ref.caching and self.ref.num_free)
    @rule(data=st.data())
    def allocate_and_cache(self, data):
        # Like a prefill: allocate, then register some of the new blocks (possibly
        # under keys other blocks already carry: no de-duplication).
        n = data.draw(st.integers(min_value=1, max_value=self.ref.num_free), label="n")
        got = self.pool.get_new_blocks(n)
        assert got == self.ref.get_new_blocks(n)
        self.held.extend(got)
        for b in got:
            key = data.draw(st.sampled_from([None] + KEY_POOL), label="key")
            if key is not None:
                self.pool.cache_block(b, key)
                self.ref.cache_block(b, key)

    @rule(data=st.data(), extra=st.integers(min_value=1, max_value=3))
    def rejected_calls(self, data, extra):
        # Spec §3.1: n > num_free raises ValueError; caching a cached block is refused.
        # The invariant then checks nothing changed.
        with pytest.raises(ValueError):
            self.pool.get_new_blocks(self.ref.num_free + extra)
        cached_held = sorted({b for b in self.held if self.ref.key[b]})
        if cached_held:
            b = data.draw(st.sampled_from(cached_held), label="cached block")
            with pytest.raises(ValueError):
                self.pool.cache_block(b, KEY_POOL[0])

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data):
        # A random sub-multiset of the held references, in random order.
        idx = data.draw(
            st.lists(st.sampled_from(range(len(self.held))), unique=True, min_size=1),
            label="held indices",
        )
        idx = data.draw(st.permutations(idx), label="order")
        ordered = [self.held[i] for i in idx]
        for i in sorted(idx, reverse=True):
            del self.held[i]
        self.pool.free_blocks(ordered)
        self.ref.free_blocks(ordered)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_a_table(self, data):
        # A request's table (a slice of the held references in allocation order) freed tail
        # first, as vLLM frees a request: runs of consecutive ids enter the queue together.
        lo = data.draw(st.integers(min_value=0, max_value=len(self.held) - 1), label="from")
        hi = data.draw(st.integers(min_value=lo + 1, max_value=len(self.held)), label="to")
        ordered = self.held[lo:hi][::-1]
        del self.held[lo:hi]
        self.pool.free_blocks(ordered)
        self.ref.free_blocks(ordered)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_one_by_one(self, data):
        # The same through one bp_free_one call per block (window and retention releases): a
        # cached block appended to the tail may continue the run of a block freed to the head.
        idx = data.draw(
            st.lists(st.sampled_from(range(len(self.held))), unique=True, min_size=1),
            label="held indices",
        )
        ordered = [self.held[i] for i in idx]
        for i in sorted(idx, reverse=True):
            del self.held[i]
        self.pool.free_blocks_one_by_one(ordered)
        self.ref.free_blocks(ordered)

    @precondition(lambda self: any(self.ref.key[b] for b in range(1, self.ref.num_blocks)))
    @rule(data=st.data())
    def touch_cached(self, data):
        # A prefix hit touches cached blocks, free (ref 0) or held by others.
        cached = [b for b in range(1, self.ref.num_blocks) if self.ref.key[b]]
        free_cached = [b for b in cached if self.ref.ref[b] == 0]
        pick_from = free_cached if free_cached and data.draw(st.booleans(), label="free only") else cached
        blocks = data.draw(st.lists(st.sampled_from(pick_from), unique=True, min_size=1), label="touch")
        self.pool.touch(blocks)
        self.ref.touch(blocks)
        self.held.extend(blocks)

    @precondition(lambda self: self.ref.caching and any(self.ref.key[b] == 0 for b in self.held))
    @rule(data=st.data())
    def cache_held(self, data):
        # vLLM caches most blocks it allocates: cache a random subset at once.
        uncached = sorted({b for b in self.held if self.ref.key[b] == 0})
        blocks = data.draw(st.lists(st.sampled_from(uncached), unique=True, min_size=1), label="blocks")
        for b in blocks:
            key = data.draw(st.sampled_from(KEY_POOL), label="key")
            self.pool.cache_block(b, key)
            self.ref.cache_block(b, key)

    @rule(key=st.sampled_from(KEY_POOL + [3, 1 + 2048, 2**64 - 2, 0xDEADBEEFCAFEF00D]))
    def lookup(self, key):
        assert self.pool.lookup(key) == self.ref.lookup(key)

    # -- comparison after every step

    @invariant()
    def same_state(self):
        if self.pool is None:
            return
        self.ref.check_invariants()
        assert self.pool.free_queue() == self.ref.queue
        # The backward links agree (a batch of pops or frees relinks the queue in one splice).
        assert self.pool.free_queue_backward() == self.ref.queue[::-1]
        assert self.pool.ring_slots <= self.pool.ring_capacity
        assert self.pool.cached_free == sum(1 for b in self.ref.queue if self.ref.key[b])
        assert self.pool.evictions == self.ref.evictions
        assert self.pool.num_free == self.ref.num_free == len(self.ref.queue)
        assert math.isclose(self.pool.usage, self.ref.usage, abs_tol=1e-12)
        n = self.ref.num_blocks
        assert [self.pool.ref_cnt(b) for b in range(1, n)] == self.ref.ref[1:]
        assert [self.pool.block_key(b) for b in range(n)] == self.ref.key
        for key in KEY_POOL:
            assert self.pool.lookup(key) == self.ref.lookup(key)
        assert sorted(self.held) == sorted(b for b in range(1, n) for _ in range(self.ref.ref[b]))


TestBlockPoolMachine = BlockPoolMachine.TestCase


# ---------------------------------------------------------------- plain unit tests


def test_initial_state():
    """Spec §1.2: block 0 is the null block; the queue starts as 1 .. N-1."""
    bp = BlockPool(11)
    assert bp.free_queue() == list(range(1, 11))
    assert bp.num_free == 10
    assert bp.usage == 0.0
    assert bp.get_new_blocks(3) == [1, 2, 3]
    assert bp.usage == pytest.approx(0.3)


def test_e1_orders_via_blockpool():
    """Spec E-1 step 3 replayed on the bare pool (keys 101..103 stand for the common prefix)."""
    bp = BlockPool(11)
    r0 = bp.get_new_blocks(4)
    assert r0 == [1, 2, 3, 4]
    for b, k in zip(r0[:3], (101, 102, 103)):
        bp.cache_block(b, k)
    bp.touch([1, 2, 3])  # r1 hits the three common blocks
    r1 = [1, 2, 3] + bp.get_new_blocks(1)
    assert r1 == [1, 2, 3, 5]
    assert [bp.ref_cnt(b) for b in range(1, 6)] == [2, 2, 2, 1, 1]
    assert bp.num_free == 5
    bp.free_blocks(r0[::-1])
    assert bp.free_queue() == [4, 6, 7, 8, 9, 10]
    bp.free_blocks(r1[::-1])
    assert bp.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    # E-1 step 5: a 10-block allocation takes the queue in eviction order and evicts all keys.
    assert bp.get_new_blocks(10) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert [bp.lookup(k) for k in (101, 102, 103)] == [None, None, None]


def test_e2_eviction_order_via_blockpool():
    """Spec E-2 (vLLM ``test_evict``): exact free-queue orders on the bare pool."""
    bp = BlockPool(11)
    r0 = bp.get_new_blocks(6)  # 87 tokens: 5 full blocks + a partial one
    assert r0 == [1, 2, 3, 4, 5, 6]
    for i, b in enumerate(r0[:5]):
        bp.cache_block(b, 1000 + i)
    r1 = bp.get_new_blocks(3)  # 48 tokens: 3 full blocks
    assert r1 == [7, 8, 9]
    for i, b in enumerate(r1):
        bp.cache_block(b, 2000 + i)
    assert bp.num_free == 1
    bp.free_blocks(r0[::-1])
    assert bp.free_queue() == [6, 10, 5, 4, 3, 2, 1]
    bp.free_blocks(r1[::-1])
    assert bp.free_queue() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    # r2 = first 35 tokens of r0: hit blocks 1, 2, then one new block.
    assert [bp.lookup(1000), bp.lookup(1001)] == [1, 2]
    bp.touch([1, 2])
    assert bp.get_new_blocks(1) == [6]
    assert bp.num_free == 7
    assert bp.free_queue() == [10, 5, 4, 3, 9, 8, 7]


def test_duplicate_key_lookup_returns_first_inserted():
    """Spec §1.2 / E-3: no de-duplication; lookup gives the earliest block still cached."""
    bp = BlockPool(6)
    a, b, c = bp.get_new_blocks(3)
    bp.cache_block(a, 7)
    bp.cache_block(b, 7)
    bp.cache_block(c, 7)
    assert bp.lookup(7) == a
    bp.free_blocks([a, b, c])
    assert bp.free_queue() == [4, 5, a, b, c]
    bp.get_new_blocks(3)  # pops 4, 5 and evicts a
    assert bp.block_key(a) == 0
    assert bp.lookup(7) == b
    bp.get_new_blocks(1)  # evicts b
    assert bp.lookup(7) == c
    bp.get_new_blocks(1)  # evicts c: the key disappears
    assert bp.lookup(7) is None


def test_touch_unlinks_from_the_middle():
    """Spec §3.1: touch removes ref-0 blocks without reordering the others; held blocks just gain a ref."""
    bp = BlockPool(8)
    blocks = bp.get_new_blocks(7)
    for i, b in enumerate(blocks):
        bp.cache_block(b, 50 + i)
    bp.free_blocks(blocks[::-1])
    assert bp.free_queue() == [7, 6, 5, 4, 3, 2, 1]
    bp.touch([4, 2])
    assert bp.free_queue() == [7, 6, 5, 3, 1]
    assert (bp.ref_cnt(4), bp.ref_cnt(2)) == (1, 1)
    bp.touch([4])
    assert bp.ref_cnt(4) == 2
    assert bp.free_queue() == [7, 6, 5, 3, 1]
    assert bp.block_key(4) == 53  # a touched block keeps its key
    bp.free_blocks([4])
    assert bp.free_queue() == [7, 6, 5, 3, 1]  # still held once: does not move
    bp.free_blocks([2, 4])
    assert bp.free_queue() == [7, 6, 5, 3, 1, 2, 4]  # re-enters at the back (LRU refresh)


def test_uncached_prepend_and_cached_append_order():
    """Spec §3.1: one free call puts its uncached blocks first (given order), cached last (given order)."""
    bp = BlockPool(9)
    blocks = bp.get_new_blocks(6)
    assert blocks == [1, 2, 3, 4, 5, 6]
    bp.cache_block(2, 11)
    bp.cache_block(5, 12)
    bp.free_blocks([6, 5, 4, 3, 2, 1])
    assert bp.free_queue() == [6, 4, 3, 1, 7, 8, 5, 2]


def test_caching_disabled_frees_everything_to_the_front():
    """Spec §3.3: with caching off every freed block goes to the front (LIFO reuse)."""
    bp = BlockPool(6, enable_caching=False)
    blocks = bp.get_new_blocks(4)
    bp.free_blocks(blocks[::-1])
    assert bp.free_queue() == [4, 3, 2, 1, 5]


def test_errors_leave_state_unchanged():
    """Spec §3.1: asking for more blocks than are free raises ValueError."""
    bp = BlockPool(4)
    with pytest.raises(ValueError):
        bp.get_new_blocks(4)
    assert bp.free_queue() == [1, 2, 3]
    with pytest.raises(ValueError):
        bp.free_blocks([1])  # not held
    assert bp.free_queue() == [1, 2, 3]
    assert bp.ref_cnt(1) == 0
    with pytest.raises(ValueError):
        BlockPool(1)


def test_ring_stale_slots_and_packing_keep_the_order():
    """The queue as a ring: a touched block leaves a stale slot that popping skips; a full ring is
    packed in order; a block freed to the head after others of its call goes after them."""
    bp = BlockPool(12)
    assert bp.ring_capacity == 32 and bp.ring_slots == 11
    blocks = bp.get_new_blocks(11)
    assert bp.ring_slots == 0
    for b in blocks[:8]:
        bp.cache_block(b, 300 + b)
    bp.free_blocks(blocks[:8][::-1])
    bp.touch([5, 8, 1])
    assert bp.free_queue() == [7, 6, 4, 3, 2]
    assert bp.ring_slots == 8  # three stale
    bp.free_blocks([1])  # cached: to the tail
    bp.free_blocks([9, 10, 11])  # uncached: first, in this order
    assert bp.free_queue() == [9, 10, 11, 7, 6, 4, 3, 2, 1]
    assert bp.free_queue_backward() == [1, 2, 3, 4, 6, 7, 11, 10, 9]
    assert bp.get_new_blocks(5) == [9, 10, 11, 7, 6]  # skips 8's stale slot
    # Churn until the ring fills: packing keeps the order.
    for _ in range(12):
        bp.touch([4])
        bp.free_blocks([4])
    assert bp.free_queue() == [3, 2, 1, 4]
    assert bp.ring_slots <= bp.ring_capacity
    # One call per block: 11 to the head, then cached 5 to the tail, then 10 after 11.
    bp.free_blocks_one_by_one([11, 5, 10])
    assert bp.free_queue() == [11, 10, 3, 2, 1, 4, 5]
    bp.free_blocks_one_by_one([9, 8, 7])  # 7's key went when it was popped: to the head
    assert bp.free_queue() == [9, 7, 11, 10, 3, 2, 1, 4, 5, 8]
    assert bp.get_new_blocks(10) == [9, 7, 11, 10, 3, 2, 1, 4, 5, 8]
