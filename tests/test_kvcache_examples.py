"""Spec worked examples E-1 .. E-6 (/work/shared/spec/vllm-kv-cache.md §9) on ``KVCache``.

All examples use one full-attention group, block size 16 and 11 blocks (block 0
is the null block, so 10 are usable), caching on.

Token identities are segments ``(stream, first, length)``: token k of a segment
is token (stream, first + k), and two requests share a token iff they share
(stream, offset).  So "48 common tokens" is ``(1, 0, 48)``; "7x[3]" after them
is a segment of its own stream continuing at offset 48; "r0's tokens x2" is the
same segment twice (same tokens, but the second copy hashes differently because
the block hash chains over its parent).

Like vLLM's own tests, the caller sets ``num_computed_tokens`` and appends
outputs between ``allocate_slots`` calls.
"""

import pytest

from aisim._core.testing import KVCache

BS = 16
NUM_BLOCKS = 11
MAX_LEN = 8192

COMMON = [(1, 0, 48)]  # three full blocks of common prefix


def make(requests, **kw):
    return KVCache(NUM_BLOCKS, BS, MAX_LEN, requests, **kw)


# ---------------------------------------------------------------- E-1


def test_e1_prefill_prefix_hit_and_free_order():
    """E-1 (vLLM ``test_prefill``): single full-attention group, bs16, 11 blocks.

    r0 = 48 common + 7x[3] -> [1,2,3,4]; r1 = common + 5x[3] hits [1,2,3] (48 tokens)
    and gets [5]; refs [2,2,2,1,1]; free(r0) -> [4,6..10]; free(r1) ->
    [5,4,6,7,8,9,10,3,2,1]; r2 = common + 6x[3] reuses 5; r3 = 160x[99] takes the
    queue in eviction order and the common prefix stops hitting.
    """
    tail3 = 2  # stream of the [3] tokens after the common prefix
    reqs = [
        COMMON + [(tail3, 48, 7)],  # r0
        COMMON + [(tail3, 48, 5)],  # r1
        COMMON + [(tail3, 48, 6)],  # r2
        [(99, 0, 160)],  # r3
        COMMON + [(tail3, 48, 7)],  # r4: probe after r3
    ]
    kv = make(reqs)

    # Step 1.
    assert kv.get_computed_blocks(0) == (0, [])
    assert kv.allocate_slots(0, 55) == [1, 2, 3, 4]
    assert kv.blocks(0) == [1, 2, 3, 4]

    # Step 2.
    assert kv.get_computed_blocks(1) == (48, [1, 2, 3])
    assert kv.allocate_slots(1, 5, 48) == [5]
    assert kv.blocks(1) == [1, 2, 3, 5]
    assert [kv.ref_cnt(b) for b in range(1, 6)] == [2, 2, 2, 1, 1]
    assert kv.num_free == 5

    # Step 3 (block 4 is an uncached partial, so it goes to the front).
    kv.free(0)
    assert kv.free_queue() == [4, 6, 7, 8, 9, 10]
    kv.free(1)
    assert kv.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # Step 4.
    assert kv.get_computed_blocks(2) == (48, [1, 2, 3])
    assert kv.allocate_slots(2, 6, 48) == [5]
    assert kv.free_queue() == [4, 6, 7, 8, 9, 10]
    kv.free(2)
    assert kv.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # Step 5.
    assert kv.get_computed_blocks(3) == (0, [])
    assert kv.allocate_slots(3, 160) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert kv.num_free == 0
    assert kv.get_computed_blocks(4) == (0, [])


# ---------------------------------------------------------------- E-2


def test_e2_eviction_order():
    """E-2 (vLLM ``test_evict``): bs16, 11 blocks.

    r0 = 87 distinct tokens -> 6 blocks; r1 = 48 new tokens -> 3 blocks; free = 1.
    free(r0) -> [6,10,5,4,3,2,1]; free(r1) -> [6,10,5,4,3,2,1,9,8,7];
    r2 = first 35 tokens of r0 -> hit [1,2] (32 tokens); alloc 3 -> [6]; free = 7.
    """
    reqs = [
        [(1, 0, 87)],  # r0
        [(2, 0, 48)],  # r1
        [(1, 0, 35)],  # r2: the first 35 tokens of r0
    ]
    kv = make(reqs)
    assert kv.allocate_slots(0, 87) == [1, 2, 3, 4, 5, 6]
    assert kv.allocate_slots(1, 48) == [7, 8, 9]
    assert kv.num_free == 1

    kv.free(0)
    assert kv.free_queue() == [6, 10, 5, 4, 3, 2, 1]
    kv.free(1)
    assert kv.free_queue() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]

    assert kv.get_computed_blocks(2) == (32, [1, 2])
    assert kv.allocate_slots(2, 3, 32) == [6]
    assert kv.blocks(2) == [1, 2, 6]
    assert kv.num_free == 7
    # Follows from §3.1 (touch unlinks 1 and 2, the head 6 is popped).
    assert kv.free_queue() == [10, 5, 4, 3, 9, 8, 7]


# ---------------------------------------------------------------- E-3


def _e3_manager():
    reqs = [
        [(1, 0, 48)],  # a
        [(1, 0, 48)],  # b: the same 48 tokens
        [(1, 0, 48), (2, 48, 5)],  # c: the 48 tokens + 5 more
        [(9, 0, 112)],  # d: 7 unrelated blocks (follow-on test only)
    ]
    return make(reqs)


def test_e3_block_aligned_resend_loses_a_whole_block():
    """E-3: block-aligned resend (bs16, 11 blocks).

    a = 48 tokens -> [1,2,3]; b = the same 48 tokens -> hit [1,2] (32 tokens, max 47);
    alloc 16 -> [4], table [1,2,4]; hash index 2 maps to {3, 4} and a lookup returns 3;
    free(a), free(b) -> [5,6,7,8,9,10,3,4,2,1]; c = 48 tokens + 5 -> hit [1,2,3] (48).
    """
    kv = _e3_manager()
    assert kv.allocate_slots(0, 48) == [1, 2, 3]

    assert kv.get_computed_blocks(1) == (32, [1, 2])
    assert kv.allocate_slots(1, 16, 32) == [4]
    assert kv.blocks(1) == [1, 2, 4]
    assert [kv.ref_cnt(b) for b in range(1, 5)] == [2, 2, 1, 1]

    kv.free(0)
    kv.free(1)
    assert kv.free_queue() == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]

    # The duplicate key returns the first-inserted block 3, not 4.
    assert kv.get_computed_blocks(2) == (48, [1, 2, 3])


def test_e3_duplicate_key_falls_back_to_second_block():
    """E-3 follow-on (§1.2): once block 3 is evicted, the duplicate key still hits block 4."""
    kv = _e3_manager()
    kv.allocate_slots(0, 48)
    kv.get_computed_blocks(1)
    kv.allocate_slots(1, 16, 32)
    kv.free(0)
    kv.free(1)
    # d takes 7 blocks from the head: 5..10 and 3 (evicting block 3's key).
    assert kv.allocate_slots(3, 112) == [5, 6, 7, 8, 9, 10, 3]
    assert kv.free_queue() == [4, 2, 1]
    assert kv.get_computed_blocks(2) == (48, [1, 2, 4])


# ---------------------------------------------------------------- E-4


def test_e4_capacity_check_counts_evictable_hits():
    """E-4 (vLLM ``test_prefill_not_enough_free_blocks_with_computed_blocks``).

    r0 = 48 tokens (blocks 1-3); r1 = r0's tokens x2 (hit 3, +3 new), then free(r1);
    r2 = 32 tokens -> free = 5. r3 = the 48 tokens x3 hits 96 tokens (6 blocks, 3 of
    them ref 0 in the free queue): 3 new + 3 evictable = 6 > 5 -> None, no ref change.
    """
    reqs = [
        COMMON,  # r0
        COMMON * 2,  # r1
        [(7, 0, 32)],  # r2
        COMMON * 3,  # r3
    ]
    kv = make(reqs)
    assert kv.get_computed_blocks(0) == (0, [])
    assert kv.allocate_slots(0, 48) == [1, 2, 3]

    assert kv.get_computed_blocks(1) == (48, [1, 2, 3])
    assert kv.allocate_slots(1, 48, 48) == [4, 5, 6]
    r1_blocks = kv.blocks(1)
    assert r1_blocks == [1, 2, 3, 4, 5, 6]
    kv.free(1)
    assert [kv.ref_cnt(b) for b in r1_blocks] == [1, 1, 1, 0, 0, 0]

    assert kv.get_computed_blocks(2) == (0, [])
    assert kv.allocate_slots(2, 32) == [7, 8]
    assert kv.num_free == 5
    queue = kv.free_queue()
    assert queue == [9, 10, 6, 5, 4]

    assert kv.get_computed_blocks(3) == (96, r1_blocks)
    assert kv.allocate_slots(3, 48, 96) is None
    assert [kv.ref_cnt(b) for b in r1_blocks] == [1, 1, 1, 0, 0, 0]
    assert kv.num_free == 5
    assert kv.free_queue() == queue
    assert kv.blocks(3) == []


# ---------------------------------------------------------------- E-5


def test_e5_full_sequence_gate():
    """E-5: a 200-token prompt, first chunk of 32: without the gate -> [1,2];
    with ``full_sequence_must_fit`` -> None (needs 13 blocks > 10)."""
    prompt = [[(1, 0, 200)]]

    kv = make(prompt)
    assert kv.allocate_slots(0, 32) == [1, 2]

    kv = make(prompt)
    assert kv.allocate_slots(0, 32, full_sequence_must_fit=True) is None
    assert kv.num_free == 10
    assert kv.free_queue() == list(range(1, 11))
    assert kv.blocks(0) == []


def test_e5_watermark():
    """E-5: watermark 0.2 -> int(0.2*11) = 2 blocks. After an 8-block request (admitted
    with has_scheduled_reqs=False) free = 2; a 1-block waiting request with
    has_scheduled_reqs=True -> None (1 + 2 > 2); with has_scheduled_reqs=False -> [9]."""
    wm = int(0.2 * NUM_BLOCKS)
    assert wm == 2
    reqs = [
        [(1, 0, 128)],  # 8 blocks
        [(2, 0, 16)],  # 1 block
    ]
    kv = make(reqs, watermark_blocks=wm)
    assert kv.allocate_slots(0, 128, has_scheduled_reqs=False) == [1, 2, 3, 4, 5, 6, 7, 8]
    kv.set_running(0)
    assert kv.num_free == 2

    assert kv.allocate_slots(1, 16, has_scheduled_reqs=True) is None
    assert kv.num_free == 2
    assert kv.allocate_slots(1, 16, has_scheduled_reqs=False) == [9]
    assert kv.num_free == 1


def test_e5_watermark_skips_running_requests():
    """E-5 / §5.1 step 3: the watermark applies only to WAITING/PREEMPTED requests."""
    reqs = [[(1, 0, 128)], [(2, 0, 16)]]
    kv = make(reqs, watermark_blocks=2)
    assert kv.allocate_slots(0, 128, has_scheduled_reqs=False) == [1, 2, 3, 4, 5, 6, 7, 8]
    kv.set_running(1)
    assert kv.allocate_slots(1, 16, has_scheduled_reqs=True) == [9]


# ---------------------------------------------------------------- E-6


def test_e6_preempt_style_free_and_readmission():
    """E-6: a = 40-token prompt, then 29 decode steps each followed by appending an
    output token; 30 outputs in all -> num_tokens 70, computed 69, table [1,2,3,4,5],
    4 cached blocks. free(a) + reset computed -> [5,6,7,8,9,10,4,3,2,1]; lookup ->
    hit [1,2,3,4], 64 tokens (max 69); alloc 6 -> [5]."""
    kv = make([[(1, 0, 40)]])
    a = 0

    # Prefill, then the token sampled from it.
    assert kv.get_computed_blocks(a) == (0, [])
    assert kv.allocate_slots(a, 40) == [1, 2, 3]
    kv.set_running(a)
    kv.set_num_computed(a, 40)
    kv.append_outputs(a, 1)

    # 29 decode steps: schedule 1 token, compute it, append the sampled token.
    computed = 40
    for _ in range(29):
        assert kv.allocate_slots(a, 1) is not None
        computed += 1
        kv.set_num_computed(a, computed)
        kv.append_outputs(a, 1)

    assert kv.num_tokens(a) == 70
    assert computed == 69
    assert kv.blocks(a) == [1, 2, 3, 4, 5]

    # Preempt-style free: cached 4,3,2,1 to the tail, uncached 5 to the head.
    kv.free(a)
    kv.set_num_computed(a, 0)
    assert kv.free_queue() == [5, 6, 7, 8, 9, 10, 4, 3, 2, 1]

    # "4 hashes": exactly blocks 1-4 were cached, so the hit stops at 64 tokens.
    assert kv.get_computed_blocks(a) == (64, [1, 2, 3, 4])
    assert kv.allocate_slots(a, 6, 64) == [5]
    assert kv.blocks(a) == [1, 2, 3, 4, 5]
    assert [kv.ref_cnt(b) for b in range(1, 6)] == [1, 1, 1, 1, 1]
    assert kv.free_queue() == [6, 7, 8, 9, 10]


@pytest.mark.parametrize("gate", [False, True])
def test_e6_readmission_same_with_full_sequence_gate(gate):
    """E-6 readmission as the scheduler does it (§7.1: waiting requests pass the gate):
    nfull = 70 tokens -> 5 blocks (4 evictable hits + 1 new) <= 10, still [5]."""
    kv = make([[(1, 0, 40)]])
    kv.allocate_slots(0, 40)
    kv.set_num_computed(0, 40)
    kv.append_outputs(0, 1)
    for step in range(29):
        kv.allocate_slots(0, 1)
        kv.set_num_computed(0, 41 + step)
        kv.append_outputs(0, 1)
    kv.free(0)
    kv.set_num_computed(0, 0)
    assert kv.get_computed_blocks(0) == (64, [1, 2, 3, 4])
    assert kv.allocate_slots(0, 6, 64, full_sequence_must_fit=gate) == [5]
