"""Spec worked examples E-7 .. E-17 (/work/shared/spec/vllm-kv-cache.md §9) on a
multi-group ``KVCache``.

The manager is built the way vLLM's unit tests build ``KVCacheManager``: from a
list of KV-cache groups resolved by :func:`aisim.config.kvgroups.resolve_groups`
(scheduler block size = LCM, hash block size = GCD or ``prefix_match_unit``).
Retention ``None`` is dense (a hand-built ``KVCacheConfig``, what vLLM's tests
use); ``0`` is the engine default (sparse, §6.4).

Token identities are segments ``(stream, first, length)``: token k of a segment
is token (stream, first + k), and two requests share a token iff they share
(stream, offset).  "48 common tokens + 7 others" is ``[(1, 0, 48), (s, 48, 7)]``
with a stream ``s`` of its own; "the first 40 of the shared 48" is ``(1, 0, 40)``.

As in vLLM's tests, the caller drives the manager: a scheduled chunk is
``allocate_slots(r, n, hit if first)`` followed by ``set_num_computed``; a decode
step is ``append_outputs(r, 1)`` (the token sampled by the previous step), then
``allocate_slots(r, 1)`` and ``set_num_computed``.  ``new_step()`` marks each
``schedule()`` step (it clears Mamba's cached-this-step set and releases
copy-on-write retentions).
"""

import math

import pytest

from aisim._core.testing import KVCache
from aisim.config.engine import engine_config_from_dict
from aisim.config.kvgroups import resolve_groups

FULL = {"type": "full"}
MAMBA = {"type": "mamba"}


def swa(window=32, **kw):
    return {"type": "sliding_window", "sliding_window": window, **kw}


def make_kv(groups, num_blocks, block_size=16, requests=(), retention=None, prefix_match_unit=None,
            version="0.32.0", max_model_len=10000):
    """A ``KVCache`` built the way vLLM's unit tests build ``KVCacheManager``.

    The engine configuration only resolves the groups (block sizes, hash block,
    spec-groups, caps).  Grouped prefix caching needs its geometry declared
    (``aisim.config.rule``): every group is declared prefix-cacheable with equal
    pages (true of these hand-built specs by construction), state groups
    declare their prefill-checkpoint blocks (0 unless given), and
    ``prefix_match_unit`` is the GCD of the group block sizes (the spec's
    hash_block_size for these examples) unless given.  vLLM's tests construct
    the manager directly, with no engine start-up capacity check (§5.10), so the
    configuration is given a pool that passes that check while the
    ``KVCache`` gets the example's pool of ``num_blocks``.
    """
    decl = []
    for g in groups:
        g = {"prefix_cacheable": True, "page_size_bytes": 1, **g}
        if g["type"] == "mamba":
            g.setdefault("prefill_checkpoint_blocks", 0)
        decl.append(g)
    sizes = [g.get("block_size", block_size) for g in decl]
    raw = dict(num_gpu_blocks=max(num_blocks, 1 << 20), block_size=block_size, max_model_len=max_model_len,
               max_num_batched_tokens=max(8192, max_model_len), kv_cache_groups=decl,
               prefix_cache_retention_interval=retention, vllm_version=version,
               prefix_match_unit=prefix_match_unit or math.gcd(*sizes))
    kw = resolve_groups(engine_config_from_dict(raw))
    return KVCache(num_blocks, block_size, max_model_len, list(requests), groups=kw["groups"],
                   hash_block_size=kw["hash_block_size"], sched_block_size=kw["sched_block_size"],
                   fine=kw["fine_grained"], retention=kw["retention"], rules=kw["rules"])


class Driver:
    """Tracks ``num_computed_tokens`` the way the scheduler's ``_update_after_schedule`` does."""

    def __init__(self, kv):
        self.kv = kv
        self.computed = {}

    def chunk(self, r, n, hit=0):
        """Schedule ``n`` new tokens of ``r`` (after a hit of ``hit`` tokens on admission)."""
        out = self.kv.allocate_slots(r, n, hit)
        assert out is not None, f"allocate_slots({r}, {n}, {hit}) failed"
        self.computed[r] = self.computed.get(r, 0) + hit + n
        self.kv.set_num_computed(r, self.computed[r])
        return out

    def chunks(self, r, ends, step=True):
        """Prefill ``r`` in chunks ending at ``ends``, one scheduler step each."""
        for end in ends:
            self.chunk(r, end - self.computed.get(r, 0))
            if step:
                self.kv.new_step()

    def decode(self, r, steps):
        """``steps`` decode steps: append the sampled token, allocate 1 slot."""
        for _ in range(steps):
            self.kv.append_outputs(r, 1)
            self.chunk(r, 1)
            self.kv.new_step()


def cached(kv, r, ngroups):
    return [kv.cached_hash_indices(r, g) for g in range(ngroups)]


# ---------------------------------------------------------------- E-7


def _e7_two_groups(retention):
    # r0 = 48 common + 7, r1 = common + 5, r2 = a new 40-token prompt.
    reqs = [[(1, 0, 48), (100, 48, 7)], [(1, 0, 48), (101, 48, 5)], [(200, 0, 40)]]
    return make_kv([FULL, swa(32)], 21, requests=reqs, retention=retention)


def test_e7_full_swa_dense():
    """E-7, retention None (dense): full bs16 + SWA bs16 (W = 32), 21 blocks.

    r0 alloc 55 -> ([1,2,3,4],[5,6,7,8]); both groups cache hash indices [0,1,2];
    r1 hits ([1,2,3],[0,6,7]) = 48 tokens, alloc 5 -> ([9],[10]); free(r0) ->
    [8,4,11..20,5]; free(r1) -> [10,9,8,4,11..20,5,3,2,1,7,6].  A new 40-token
    prompt with 30 decode steps ends at ([10,9,8,13,15],[0,0,12,14,16]), free 12.
    """
    kv = _e7_two_groups(None)
    d = Driver(kv)
    assert kv.get_computed_blocks(0) == (0, ([], []))
    assert d.chunk(0, 55) == ([1, 2, 3, 4], [5, 6, 7, 8])
    assert cached(kv, 0, 2) == [[0, 1, 2], [0, 1, 2]]

    assert kv.get_computed_blocks(1) == (48, ([1, 2, 3], [0, 6, 7]))
    assert kv.shared_prefix_boundary(1) == 0
    assert d.chunk(1, 5, 48) == ([9], [10])
    assert kv.blocks(1) == ([1, 2, 3, 9], [0, 6, 7, 10])

    kv.free(0)
    assert kv.free_queue() == [8, 4, *range(11, 21), 5]
    kv.free(1)
    assert kv.free_queue() == [10, 9, 8, 4, *range(11, 21), 5, 3, 2, 1, 7, 6]

    assert kv.get_computed_blocks(2) == (0, ([], []))
    d.chunk(2, 40)
    kv.new_step()
    d.decode(2, 30)
    assert d.computed[2] == 70
    assert kv.blocks(2) == ([10, 9, 8, 13, 15], [0, 0, 12, 14, 16])
    assert kv.num_free == 12


def test_e7_full_swa_retention0():
    """E-7, retention 0 (engine default): SWA caches only hash indices [1,2]
    (replay boundary 54 -> 48 -> the 2 blocks ending at 48); r1 still hits
    ([1,2,3],[0,6,7]); free(r0) -> [8,5,4,11..20]; free(r1) ->
    [10,9,8,5,4,11..20,3,2,1,7,6]; the 40-token + 30-decode request ends at
    ([10,9,8,12,14],[0,0,11,13,15]) with SWA caching only [0,1].
    """
    kv = _e7_two_groups(0)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    assert d.chunk(0, 55) == ([1, 2, 3, 4], [5, 6, 7, 8])
    assert cached(kv, 0, 2) == [[0, 1, 2], [1, 2]]

    assert kv.get_computed_blocks(1) == (48, ([1, 2, 3], [0, 6, 7]))
    assert d.chunk(1, 5, 48) == ([9], [10])

    kv.free(0)
    assert kv.free_queue() == [8, 5, 4, *range(11, 21)]
    kv.free(1)
    assert kv.free_queue() == [10, 9, 8, 5, 4, *range(11, 21), 3, 2, 1, 7, 6]

    kv.get_computed_blocks(2)
    d.chunk(2, 40)
    kv.new_step()
    d.decode(2, 30)
    assert kv.blocks(2) == ([10, 9, 8, 12, 14], [0, 0, 11, 13, 15])
    assert kv.cached_hash_indices(2, 1) == [0, 1]  # decode-time SWA blocks are never cached
    assert kv.num_free == 12


def _e7_three_groups():
    reqs = [[(1, 0, 48), (100, 48, 7)], [(1, 0, 48), (101, 48, 5)], [(1, 0, 48), (102, 48, 5)]]
    kv = make_kv([FULL, swa(32), swa(32)], 21, requests=reqs)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    first = d.chunk(0, 55)
    hit = kv.get_computed_blocks(1)
    second = d.chunk(1, 5, 48)
    return kv, first, hit, second


def test_e7_three_groups_prefill():
    """E-7, vLLM's variant [full, SWA, SWA] (the two SWA groups looked up jointly),
    21 blocks, dense: r0 alloc 55 -> ([1,2,3,4],[5,6,7,8],[9,10,11,12]); r1 hits
    ([1,2,3],[0,6,7],[0,10,11]) = 48 tokens; alloc 5 -> ([13],[14],[15])."""
    kv, first, hit, second = _e7_three_groups()
    assert first == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    assert hit == (48, ([1, 2, 3], [0, 6, 7], [0, 10, 11]))
    assert second == ([13], [14], [15])


@pytest.mark.parametrize("evict, expect", [
    pytest.param([(1, 0), (2, 0)], 48, id="swa-hash0"),
    pytest.param([(0, 0)], 0, id="full-hash0"),
    pytest.param([(0, 2), (1, 2), (2, 2)], 32, id="all-hash2"),
    pytest.param([(0, 2), (1, 0), (2, 0)], 0, id="full-hash2+swa-hash0"),
])
def test_e7_three_groups_partial_hits(evict, expect):
    """E-7 partial-hit cases (``test_prefill_hybrid_model``), after freeing r0 and
    r1, removing keys for a new common + 5 request: SWA keys of hash 0 -> 48;
    the full key of hash 0 -> 0; all keys of hash 2 -> 32; the full key of
    hash 2 + the SWA keys of hash 0 -> 0 (full 16, SWA 32 -> fixed point 0).
    Every group returns hit / 16 entries."""
    kv, *_ = _e7_three_groups()
    kv.free(0)
    kv.free(1)
    for group, index in evict:
        kv.evict_key(2, group, index)
    hit, blocks = kv.get_computed_blocks(2)
    assert hit == expect
    assert [len(b) for b in blocks] == [expect // 16] * 3
    if expect == 48:
        assert blocks == ([1, 2, 3], [0, 6, 7], [0, 10, 11])


# ---------------------------------------------------------------- E-8

E8_GROUPS = [{"type": "full", "block_size": 32}, swa(32, block_size=16)]


def test_e8_different_block_sizes_dense():
    """E-8 (``test_different_block_size``): full bs32 + SWA bs16 (W = 32), H = 16,
    scheduler bs 32, 100 blocks.  r0 = 160 tokens, alloc 112 ->
    ([1,2,3,4],[5..11]); offered tokens round to 96: full caches hash indices
    [1,3,5], SWA [0..5].  Lookups: 113 tokens -> 96 (3 / 6 blocks), 97 -> 96,
    96 -> 64 (2 / 4).  Evicting SWA keys of hash 5 and 6 -> 64, not 80."""
    reqs = [[(1, 0, 160)], [(1, 0, 113)], [(1, 0, 97)], [(1, 0, 96)]]
    kv = make_kv(E8_GROUPS, 100, requests=reqs)
    d = Driver(kv)
    assert kv.get_computed_blocks(0) == (0, ([], []))
    assert d.chunk(0, 112) == ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11])
    assert cached(kv, 0, 2) == [[1, 3, 5], [0, 1, 2, 3, 4, 5]]

    for r, expect in ((1, 96), (2, 96), (3, 64)):
        hit, (full, sw) = kv.get_computed_blocks(r)
        assert (hit, len(full), len(sw)) == (expect, expect // 32, expect // 16)
    assert kv.get_computed_blocks(1) == (96, ([1, 2, 3], [0, 0, 0, 0, 9, 10]))

    kv.evict_key(1, 1, 6)
    kv.evict_key(1, 1, 5)
    hit, (full, sw) = kv.get_computed_blocks(1)
    assert (hit, len(full), len(sw)) == (64, 2, 4)


def test_e12_swa_112_token_prompt_lcm_rounding():
    """E-12 / §6.2: a 112-token prompt in full 32 + SWA 16 (W = 32), dense: offered
    tokens round down to 96, so full caches 3 blocks and SWA keeps hash indices
    0..5 (index 6 is not cached)."""
    kv = make_kv(E8_GROUPS, 100, requests=[[(1, 0, 112)]])
    d = Driver(kv)
    kv.get_computed_blocks(0)
    assert d.chunk(0, 112) == ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11])
    assert cached(kv, 0, 2) == [[1, 3, 5], [0, 1, 2, 3, 4, 5]]


@pytest.mark.parametrize("version, full_keys", [
    ("0.31.0", [1, 3, 5, 7, 9]),
    ("0.32.0", [1, 3, 5, 7, 8, 9]),
])
def test_e8_retention0(version, full_keys):
    """E-8 retention 0, 160 tokens fully allocated: full keys at [1,3,5,7,8,9]
    (0.31: [1,3,5,7,9], §8 #3: the partial-tail key at hash 8); SWA keys at
    [6,7] only.  The identical resend hits 128 (4 full blocks, 8 SWA entries);
    a 97-token prefix hits 0."""
    reqs = [[(1, 0, 160)], [(1, 0, 160)], [(1, 0, 97)]]
    kv = make_kv(E8_GROUPS, 100, requests=reqs, retention=0, version=version)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    d.chunk(0, 160)
    assert cached(kv, 0, 2) == [full_keys, [6, 7]]
    hit, (full, sw) = kv.get_computed_blocks(1)
    assert (hit, len(full), len(sw)) == (128, 4, 8)
    assert kv.get_computed_blocks(2)[0] == 0


# ---------------------------------------------------------------- E-9


def _e9(retention):
    # r0 = 48 shared + 7; r1 = the 48 + 10 new; r2 = the first 40 + 20 new.
    reqs = [[(1, 0, 48), (100, 48, 7)], [(1, 0, 48), (101, 48, 10)], [(1, 0, 40), (102, 40, 20)]]
    return make_kv([FULL, MAMBA], 30, requests=reqs, retention=retention)


@pytest.mark.parametrize("retention", [None, 0])
def test_e9_full_mamba_chunks(retention):
    """E-9: full bs16 + Mamba align bs16, 30 blocks, a 55-token prompt in chunks
    [48, 7].  After 48: ([1,2,3],[0,0,4]), Mamba caches [2], free 25; after 55:
    ([1,2,3,5],[0,0,4,6]), full [0,1,2], free 23; after 12 decode steps
    (computed 67): ([1,2,3,5,7],[0,0,0,0,8]), free 23, Mamba cached [2,3] dense,
    [2] with retention 0.  r1 (48 + 10) hits ([1,2,3],[0,0,4]) = 48, boundary 0;
    r2 (first 40 + 20) hits 0 with shared_prefix_boundary 32.  Dense: freeing r0
    and r1 leaves [10,9,8,7,11..29,6,5,3,2,1,4]."""
    kv = _e9(retention)
    d = Driver(kv)
    assert kv.get_computed_blocks(0) == (0, ([], []))
    d.chunks(0, [48])
    assert kv.blocks(0) == ([1, 2, 3], [0, 0, 4])
    assert kv.cached_hash_indices(0, 1) == [2]
    assert kv.num_free == 25
    d.chunks(0, [55])
    assert kv.blocks(0) == ([1, 2, 3, 5], [0, 0, 4, 6])
    assert cached(kv, 0, 2) == [[0, 1, 2], [2]]
    assert kv.num_free == 23

    d.decode(0, 12)
    assert d.computed[0] == 67
    assert kv.blocks(0) == ([1, 2, 3, 5, 7], [0, 0, 0, 0, 8])
    assert kv.num_free == 23
    assert kv.cached_hash_indices(0, 1) == ([2, 3] if retention is None else [2])

    assert kv.get_computed_blocks(1) == (48, ([1, 2, 3], [0, 0, 4]))
    assert kv.shared_prefix_boundary(1) == 0
    d.chunk(1, 10, 48)

    assert kv.get_computed_blocks(2) == (0, ([], []))
    assert kv.shared_prefix_boundary(2) == 32

    if retention is None:
        kv.free(0)
        kv.free(1)
        assert kv.free_queue() == [10, 9, 8, 7, *range(11, 30), 6, 5, 3, 2, 1, 4]


def test_e9b_single_chunk_leaves_no_mamba_state():
    """E-9b: the same 55-token prompt as one chunk -> ([1,2,3,4],[0,0,0,5]); no
    Mamba key is cached; r1 (48 + 10) then hits 0 with boundary 48."""
    kv = _e9(None)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    assert d.chunk(0, 55) == ([1, 2, 3, 4], [5])
    assert kv.blocks(0) == ([1, 2, 3, 4], [0, 0, 0, 5])
    assert cached(kv, 0, 2) == [[0, 1, 2], []]
    kv.new_step()
    assert kv.get_computed_blocks(1) == (0, ([], []))
    assert kv.shared_prefix_boundary(1) == 48


# ---------------------------------------------------------------- E-10


def _e10():
    # r0 = 80 tokens; r1 = r0's 80 + 8 others; r2 = the first 70 + 8 others.
    reqs = [[(1, 0, 80)], [(1, 0, 80), (100, 80, 8)], [(1, 0, 70), (101, 70, 8)]]
    kv = make_kv([FULL, swa(32), MAMBA], 60, requests=reqs)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    d.chunks(0, [32, 48, 64, 80])
    return kv


def test_e10_three_groups_prefill():
    """E-10: full + SWA (W = 32) + Mamba align, bs16, 60 blocks, dense; r0 = 80
    tokens in chunks ending at 32/48/64/80 -> ([1,2,6,9,12],[0,0,7,10,13],
    [0,0,0,11,14]); cached indices full [0..4], SWA [0..4], Mamba [1,2,3,4]."""
    kv = _e10()
    assert kv.blocks(0) == ([1, 2, 6, 9, 12], [0, 0, 7, 10, 13], [0, 0, 0, 11, 14])
    assert cached(kv, 0, 3) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [1, 2, 3, 4]]
    # The out-of-window SWA blocks and stale states were freed but stay cached.
    for b in (3, 4, 5, 8):
        assert kv.ref_cnt(b) == 0 and b in kv.free_queue()


@pytest.mark.parametrize("r, evict, hit, boundary, ids", [
    pytest.param(1, None, 80, 0, ([1, 2, 6, 9, 12], [0, 0, 0, 10, 13], [0, 0, 0, 0, 14]), id="intact"),
    pytest.param(1, (2, 4), 64, 80, None, id="mamba-hash4"),
    pytest.param(1, (1, 2), 80, 0, None, id="swa-hash2"),
    pytest.param(1, (0, 3), 48, 0, ([1, 2, 6], [0, 4, 7], [0, 0, 8]), id="full-hash3"),
    pytest.param(2, None, 64, 0, None, id="70-token-prefix"),
])
def test_e10_three_groups_lookups(r, evict, hit, boundary, ids):
    """E-10 lookups (prompt = r0's 80 tokens + 8 others): intact -> 80 with ids
    ([1,2,6,9,12],[0,0,0,10,13],[0,0,0,0,14]); Mamba key of hash 4 removed -> 64,
    shared_prefix_boundary 80; SWA key of hash 2 removed -> 80; full key of
    hash 3 removed -> 48 with ids ([1,2,6],[0,4,7],[0,0,8]) (4 and 8 come back
    from the free queue); a 70-token prefix -> 64."""
    kv = _e10()
    if evict:
        kv.evict_key(r, *evict)
    got_hit, got_ids = kv.get_computed_blocks(r)
    assert got_hit == hit
    assert kv.shared_prefix_boundary(r) == boundary
    if ids is not None:
        assert got_ids == ids


# ---------------------------------------------------------------- E-11


@pytest.mark.parametrize("retention, keys, prefix_hit", [
    (None, list(range(16)), 192),
    (0, [14], 0),
    (64, [3, 7, 11, 14, 15], 192),
])
def test_e11_pure_swa(retention, keys, prefix_hit):
    """E-11 (``test_pure_swa_*``): unitary SWA, bs16, W = 16, a 256-token prompt.
    Cached hash indices: None -> 0..15, 0 -> {14}, 64 -> {3,7,11,14,15}.  The
    resend hits 240 (14 nulls + block 15) in every case; a 200-token prefix
    hits 192, 0, 192."""
    reqs = [[(1, 0, 256)], [(1, 0, 256)], [(1, 0, 200), (100, 200, 1)]]
    kv = make_kv([swa(16)], 40, requests=reqs, retention=retention)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    d.chunk(0, 256)
    assert kv.cached_hash_indices(0, 0) == keys
    assert kv.get_computed_blocks(1) == (240, [0] * 14 + [15])
    assert kv.get_computed_blocks(2)[0] == prefix_hit


# ---------------------------------------------------------------- E-12

E12_GROUPS = [{"type": "full", "block_size": 32}, swa(8, block_size=8)]


def test_e12_swa_dense_mask_with_lcm_segments():
    """E-12 (``test_hybrid_local_kv_retention_*``): full bs32 + SWA bs8 (W = 8),
    dense: SWA keeps only hash indices 3 and 7 of a 64-token prompt (need 1,
    segment = the LCM 32 = 4 SWA blocks)."""
    kv = make_kv(E12_GROUPS, 40, block_size=8, requests=[[(1, 0, 64)]])
    d = Driver(kv)
    kv.get_computed_blocks(0)
    d.chunk(0, 64)
    assert kv.cached_hash_indices(0, 1) == [3, 7]


@pytest.mark.parametrize("retention, keys", [(64, [7, 11, 15]), (0, [11])])
def test_e12_swa_retention(retention, keys):
    """E-12: full bs32 + SWA bs8 (W = 8), 128-token prompt: retention 64 -> SWA
    keeps {7, 11, 15}; retention 0 -> {11}.  With retention 0 the resend hits
    96 (12 SWA entries) and a 96-token request hits 0."""
    reqs = [[(1, 0, 128)], [(1, 0, 128)], [(1, 0, 96)]]
    kv = make_kv(E12_GROUPS, 60, block_size=8, requests=reqs, retention=retention)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    d.chunk(0, 128)
    assert kv.cached_hash_indices(0, 1) == keys
    if retention == 0:
        hit, (full, sw) = kv.get_computed_blocks(1)
        assert (hit, len(full), len(sw)) == (96, 3, 12)
        assert kv.get_computed_blocks(2)[0] == 0


def _mamba_mask(retention, junction):
    """Full + Mamba bs16, a 256-token prompt in 16-token chunks (so every block
    boundary is a chunk end and the mask alone decides what is cached).  With
    ``junction`` the request first finds a 96-token shared-prefix junction: an
    earlier request cached 100 shared tokens in one chunk (full blocks only)."""
    reqs = [[(1, 0, 256)], [(2, 0, 100)], [(2, 0, 100), (3, 100, 156)]]
    kv = make_kv([FULL, MAMBA], 80, requests=reqs, retention=retention)
    d = Driver(kv)
    r = 0
    if junction:
        kv.get_computed_blocks(1)
        d.chunks(1, [100])
        r = 2
        assert kv.get_computed_blocks(r) == (0, ([], []))
        assert kv.shared_prefix_boundary(r) == 96
    else:
        kv.get_computed_blocks(r)
    d.chunks(r, range(16, 257, 16))
    return kv.cached_hash_indices(r, 1)


@pytest.mark.parametrize("retention, keys", [
    (None, list(range(16))),
    (16, list(range(16))),
    (64, [3, 7, 11, 14, 15]),
    (0, [14]),
])
def test_e12_mamba_reachable_mask(retention, keys):
    """E-12 (``test_mamba_reachable_block_mask_*``), Mamba bs16, blocks 0..15,
    boundary 255: None -> dense; interval 16 -> dense; 64 -> {3,7,11,14,15};
    0 -> {14}."""
    assert _mamba_mask(retention, junction=False) == keys


@pytest.mark.parametrize("retention, keys", [(0, [5, 14]), (64, [3, 5, 7, 11, 14, 15])])
def test_e12_mamba_reachable_mask_with_junction(retention, keys):
    """E-12: adding junction 96 -> {5, 14} (retention 0); with 64 ->
    {3, 5, 7, 11, 14, 15}."""
    assert _mamba_mask(retention, junction=True) == keys


# ---------------------------------------------------------------- E-14


def test_e14_full_mamba_retention0_timeline():
    """E-14 manager-level facts, full + Mamba align, retention 0, bs16, 40 blocks.

    Steps as the sync scheduler runs them (running requests first): A (48 shared
    + 7, max_tokens 4) 48 tok -> ([1,2,3],[0,0,4]), free 35; A 7 tok; B (48 + 10)
    at step 3 hits 48 -> ([1,2,3,7],[0,0,4,8]); C (first 40 + 20) at step 4
    hits 0 with junction 32, so its chunk is 32 tok into fresh blocks
    ([9,10],[0,11]); A finishes at step 4; step 5: C 16 tok -> ([9,10,6],[0,11,5]);
    step 6: C 12 tok, D (first 40 + 20) hits 32 with full [1,2] (first-inserted
    duplicates) and Mamba state 11 (cached by C at its junction); D 16 tok ->
    ([1,2,12],[0,11,13]).

    The spec does not give B's max_tokens; D's fresh ids 12/13 follow only if B
    has finished (freed) before step 6, i.e. B's max_tokens is 3 -- modelled so.
    """
    A, B, C, D = range(4)
    reqs = [[(1, 0, 48), (100, 48, 7)], [(1, 0, 48), (101, 48, 10)],
            [(1, 0, 40), (102, 40, 20)], [(1, 0, 40), (103, 40, 20)]]
    kv = make_kv([FULL, MAMBA], 40, requests=reqs, retention=0)
    d = Driver(kv)
    # step 0
    assert kv.get_computed_blocks(A) == (0, ([], []))
    d.chunk(A, 48)
    assert kv.blocks(A) == ([1, 2, 3], [0, 0, 4])
    assert kv.num_free == 35
    kv.new_step()
    # step 1: A finishes its prompt and samples
    d.chunk(A, 7)
    kv.append_outputs(A)
    kv.new_step()
    # step 2
    d.chunk(A, 1)
    kv.append_outputs(A)
    kv.new_step()
    # step 3: B arrives
    d.chunk(A, 1)
    kv.append_outputs(A)
    assert kv.get_computed_blocks(B) == (48, ([1, 2, 3], [0, 0, 4]))
    d.chunk(B, 10, 48)
    kv.append_outputs(B)
    assert kv.blocks(B) == ([1, 2, 3, 7], [0, 0, 4, 8])
    kv.new_step()
    # step 4: C arrives; A's 4th token ends it
    d.chunk(A, 1)
    d.chunk(B, 1)
    kv.append_outputs(B)
    assert kv.get_computed_blocks(C) == (0, ([], []))
    assert kv.shared_prefix_boundary(C) == 32
    assert d.chunk(C, 32) == ([9, 10], [11])
    assert kv.blocks(C) == ([9, 10], [0, 11])
    kv.free(A)
    kv.new_step()
    # step 5: B's 3rd token ends it (assumed)
    d.chunk(B, 1)
    d.chunk(C, 16)
    assert kv.blocks(C) == ([9, 10, 6], [0, 11, 5])
    assert kv.cached_hash_indices(C, 1) == [1, 2]  # junction 32, replay boundary 48
    kv.free(B)
    kv.new_step()
    # step 6
    d.chunk(C, 12)
    assert kv.get_computed_blocks(D) == (32, ([1, 2], [0, 11]))
    d.chunk(D, 16, 32)
    assert kv.blocks(D) == ([1, 2, 12], [0, 11, 13])


def test_e14_full_swa_retention0():
    """E-14, full + SWA (W = 32), retention 0, bs16, 40 blocks, one request after
    the other (each with 4 output tokens): A 55 tok -> ([1,2,3,4],[5,6,7,8]);
    B (48 + 10) hits 48 -> ([1,2,3,8],[0,6,7,4]); C (first 40 + 20) hits 0 because
    SWA block 0 was never cached under retention 0, and allocates fresh blocks
    ([4,8,5,9],[10,11,12,13])."""
    A, B, C = range(3)
    reqs = [[(1, 0, 48), (100, 48, 7)], [(1, 0, 48), (101, 48, 10)], [(1, 0, 40), (102, 40, 20)]]
    kv = make_kv([FULL, swa(32)], 40, requests=reqs, retention=0)
    d = Driver(kv)
    kv.get_computed_blocks(A)
    assert d.chunk(A, 55) == ([1, 2, 3, 4], [5, 6, 7, 8])
    kv.new_step()
    d.decode(A, 3)
    kv.free(A)

    assert kv.get_computed_blocks(B)[0] == 48
    d.chunk(B, 10, 48)
    assert kv.blocks(B) == ([1, 2, 3, 8], [0, 6, 7, 4])
    kv.new_step()
    d.decode(B, 3)
    kv.free(B)

    assert kv.get_computed_blocks(C) == (0, ([], []))
    d.chunk(C, 60)
    assert kv.blocks(C) == ([4, 8, 5, 9], [10, 11, 12, 13])


# ---------------------------------------------------------------- E-15


def test_e15_fine_grained_hits():
    """E-15: full bs8 + Mamba align bs8, H = prefix_match_unit = 4, 40 blocks,
    dense.  A 22-token prompt in chunks [16, 4, 2]: after 16 ([1,2],[0,3]); after
    20 ([1,2,4],[0,3,5]) with full keys [1,3,4] and Mamba keys [3,4]; after 22
    ([1,2,4],[0,0,5]).  r1 (first 20 + 9) hits 20 with ([1,2,4],[0,0,6]) (6 is
    the copy of 5's state at 20); alloc -> ([7,8],[9,10]), table
    ([1,2,7,8],[0,0,9,10]).  r2 (first 18) hits 16; the resend of the 22 tokens
    hits 20."""
    reqs = [[(1, 0, 22)], [(1, 0, 20), (100, 20, 9)], [(1, 0, 18)], [(1, 0, 22)]]
    kv = make_kv([FULL, MAMBA], 40, block_size=8, requests=reqs, prefix_match_unit=4)
    d = Driver(kv)
    assert kv.get_computed_blocks(0) == (0, ([], []))
    d.chunks(0, [16])
    assert kv.blocks(0) == ([1, 2], [0, 3])
    d.chunks(0, [20])
    assert kv.blocks(0) == ([1, 2, 4], [0, 3, 5])
    assert cached(kv, 0, 2) == [[1, 3, 4], [3, 4]]
    d.chunks(0, [22])
    assert kv.blocks(0) == ([1, 2, 4], [0, 0, 5])

    assert kv.get_computed_blocks(1) == (20, ([1, 2, 4], [0, 0, 6]))
    assert d.chunk(1, 9, 20) == ([7, 8], [9, 10])
    assert kv.blocks(1) == ([1, 2, 7, 8], [0, 0, 9, 10])

    assert kv.get_computed_blocks(2)[0] == 16
    assert kv.get_computed_blocks(3)[0] == 20


# ---------------------------------------------------------------- E-16


def test_e16_prefill_checkpoint():
    """E-16: full + Mamba bs16 with num_prefill_checkpoint_blocks = 1 (alignment 1),
    30 blocks, dense.  One 55-token chunk -> ([1,2,3,4],[0,0,5,6]) with the
    checkpoint (48, index 2); Mamba caches hash index [2].  After one decode
    ([1,2,3,4],[0,0,0,6]), free 24.  r1 (48 shared) hits 48, ([1,2,3],[0,0,5])."""
    reqs = [[(1, 0, 48), (100, 48, 7)], [(1, 0, 48), (101, 48, 10)]]
    mamba = dict(MAMBA, prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    kv = make_kv([FULL, mamba], 30, requests=reqs)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    assert d.chunk(0, 55) == ([1, 2, 3, 4], [5, 6])
    assert kv.blocks(0) == ([1, 2, 3, 4], [0, 0, 5, 6])
    assert cached(kv, 0, 2) == [[0, 1, 2], [2]]
    kv.new_step()
    d.decode(0, 1)
    assert kv.blocks(0) == ([1, 2, 3, 4], [0, 0, 0, 6])
    assert kv.num_free == 24
    assert kv.get_computed_blocks(1) == (48, ([1, 2, 3], [0, 0, 5]))


# ---------------------------------------------------------------- E-17

T, F = True, False


@pytest.mark.parametrize("pattern, hit_blocks", [
    ([T], 1), ([T, F], 1), ([T, T], 2), ([T, T, F], 2), ([T, T, T], 3), ([T, T, T, F], 3),
    ([T, T, F, T, F, F, T, T, F, T, T, T], 12),
    ([T, T, F, T, F, F, T, T, F, F, F], 8),
])
def test_e17_swa_lookup_patterns(pattern, hit_blocks):
    """E-17 (``run_one_case``): SWA W = 4, bs2, right-to-left lookup over cached-flag
    patterns.  The pattern is built by caching every block through a first
    request and removing the keys marked F; the probe has one extra token so
    its lookup bound covers every block.  Entries before the window are null."""
    n = len(pattern)
    reqs = [[(1, 0, 2 * n)], [(1, 0, 2 * n), (2, 2 * n, 1)]]
    kv = make_kv([swa(4, block_size=2)], 40, block_size=2, requests=reqs)
    d = Driver(kv)
    kv.get_computed_blocks(0)
    d.chunk(0, 2 * n)
    for i, present in enumerate(pattern):
        if not present:
            kv.evict_key(1, 0, i)
    hit, blocks = kv.get_computed_blocks(1)
    assert hit == 2 * hit_blocks
    assert len(blocks) == hit_blocks
    need = 2  # ceil((W - 1) / bs)
    real = min(need, hit_blocks)
    assert blocks[:hit_blocks - real] == [0] * (hit_blocks - real)
    assert blocks[hit_blocks - real:] == list(range(hit_blocks - real + 1, hit_blocks + 1))


def test_e17_chunked_local_remove_skipped():
    """E-17: chunked-local C = 4, bs2: remove_skipped at n = 4 -> 2 nulls; n = 6 ->
    2 nulls; n = 12 -> 6.  Driven through allocate_slots, which runs
    remove_skipped_blocks at the computed count before allocating; the freed
    (cached) blocks go to the back of the queue, highest index first."""
    kv = make_kv([{"type": "chunked_local", "attention_chunk_size": 4, "block_size": 2}], 30,
                 block_size=2, requests=[[(1, 0, 16)]])
    kv.get_computed_blocks(0)
    assert kv.allocate_slots(0, 12) == [1, 2, 3, 4, 5, 6]
    kv.set_num_computed(0, 4)
    assert kv.allocate_slots(0, 1) == []
    assert kv.blocks(0) == [0, 0, 3, 4, 5, 6]
    assert kv.free_queue()[-2:] == [2, 1]
    kv.set_num_computed(0, 6)
    assert kv.allocate_slots(0, 1) == []
    assert kv.blocks(0) == [0, 0, 3, 4, 5, 6]
    kv.set_num_computed(0, 12)
    assert kv.allocate_slots(0, 1) == [7]
    assert kv.blocks(0)[:6] == [0] * 6
    assert kv.free_queue()[-6:] == [2, 1, 6, 5, 4, 3]
