"""Python handles on the core's C structs and its enum codes, for tests only.

Built as ``aisim._core.testing``; nothing in aisim imports it.  ``BlockPool``
drives one block pool and ``KVCache`` one KV-cache manager with its own
requests, the way vLLM's own unit tests drive ``BlockPool`` and
``KVCacheManager``; ``enum_codes`` reads every ``cdef enum`` code by its C
name so that a test can check ``aisim._core.constants`` (and the column
tables of ``aisim._core.engine``) against the declarations themselves.
"""

import numpy as np

from aisim.config.versions import core_rules

from aisim._core.blockpool cimport (
    TAG_DEFER, BlockPoolC, bp_cache, bp_defer_run, bp_free_one, bp_free_queue, bp_free_reversed, bp_head,
    bp_init, bp_key_deferred, bp_lookup, bp_materialize, bp_nodes, bp_pop_free, bp_pop_n, bp_release,
    bp_remove_hashes, bp_touch, bp_usage,
)
from aisim._core.engine cimport (
    EV_ARRIVED, EV_FINISHED, EV_NEW, EV_PREEMPTED, EV_RESUMED, EV_SCHED, EV_SPEC, EV_SPEC_ACCEPTED,
    EV_OFF_DONE, EV_OFF_FLUSH, EV_OFF_LOAD, EV_OFF_LOAD_CHUNKS, EV_OFF_LOAD_TOKENS, EV_OFF_LOOKUP,
    EV_OFF_LOOKUP_EXT, EV_OFF_RECV, EV_OFF_STORE, EV_OFF_STORE_CHUNKS, EV_OFF_WAIT,
    EV_SPEC_PADDED, LINE_DRAIN, LINE_STEP, N_REQ_COLS, N_STEP_COLS, RC_ARRIVAL, RC_CACHED, RC_PICKED_UP,
    RC_CACHED_ALL, RC_FINISH, RC_FIRST_SCHED, RC_FIRST_TOKEN, RC_OUTPUT, RC_PREEMPTIONS,
    RC_SPEC_ACCEPTED, RC_SPEC_DRAFTS, RC_STATUS, SC_CACHED_BLOCKS, SC_CLOCK, SC_DECODE,
    SC_DURATION, SC_FREE_BLOCKS, SC_FREE_SCHED, SC_HITS, SC_KIND, SC_NUM_FINISHED, SC_NUM_NEW,
    SC_NUM_PREEMPTED, SC_NUM_REQS, SC_NUM_RESUMED, SC_P_HITS, SC_P_QUERIES, SC_PREFILL,
    SC_QUERIES, SC_RUNNING, SC_SPEC_ACCEPTED, SC_SPEC_TOKENS, SC_STEP, SC_UPDATED_STEP, SC_WAITING,
)
from aisim._core.hashing cimport group_key, hash_extend
from aisim._core.kvcache cimport (
    GK_CHUNKED, GK_FULL, GK_MAMBA, GK_RING, GK_SWA, MAX_GROUPS, GroupSpecC, KVCacheC,
    kv_acquire_slot, kv_allocate_slots, kv_cache_blocks, kv_end_schedule, kv_free,
    kv_get_computed_blocks, kv_init, kv_new_step_starts, kv_release, specs_from_dicts,
)
from aisim._core.kvrows cimport kv_hashes, kv_n_hashes, kv_table
from aisim._core.memory cimport mem_calloc, mem_free
from aisim._core.request cimport (
    ReqC, ST_FINISHED, ST_PENDING, ST_PREEMPTED, ST_RUNNING, ST_WAITING,
)
from aisim._core.scheduler cimport ACC_COUNTS, ACC_HISTOGRAM, ACC_PERMILLE
from aisim._core.steptime cimport AX_BATCH, AX_KV, AX_PREFILL, TM_LINEAR, TM_ROOFLINE, TM_TABLE
from aisim._core.types cimport block_id_t, flag_t, hash_t, int32_t, int64_t, tok_t
from aisim._core.util cimport num_tokens


def enum_codes():
    """Every enum code of the core by its C name (``ext/*.pxd``).

    Returns
    -------
    dict of str to int
    """
    return {
        "ST_PENDING": ST_PENDING, "ST_WAITING": ST_WAITING, "ST_RUNNING": ST_RUNNING,
        "ST_PREEMPTED": ST_PREEMPTED, "ST_FINISHED": ST_FINISHED,
        "GK_FULL": GK_FULL, "GK_SWA": GK_SWA, "GK_CHUNKED": GK_CHUNKED, "GK_MAMBA": GK_MAMBA,
        "GK_RING": GK_RING,
        "EV_ARRIVED": EV_ARRIVED, "EV_SCHED": EV_SCHED, "EV_NEW": EV_NEW, "EV_RESUMED": EV_RESUMED,
        "EV_PREEMPTED": EV_PREEMPTED, "EV_FINISHED": EV_FINISHED, "EV_SPEC": EV_SPEC,
        "EV_SPEC_ACCEPTED": EV_SPEC_ACCEPTED, "EV_SPEC_PADDED": EV_SPEC_PADDED,
        "EV_OFF_LOOKUP": EV_OFF_LOOKUP, "EV_OFF_LOOKUP_EXT": EV_OFF_LOOKUP_EXT, "EV_OFF_LOAD": EV_OFF_LOAD,
        "EV_OFF_LOAD_TOKENS": EV_OFF_LOAD_TOKENS, "EV_OFF_LOAD_CHUNKS": EV_OFF_LOAD_CHUNKS,
        "EV_OFF_STORE": EV_OFF_STORE, "EV_OFF_STORE_CHUNKS": EV_OFF_STORE_CHUNKS, "EV_OFF_FLUSH": EV_OFF_FLUSH,
        "EV_OFF_WAIT": EV_OFF_WAIT, "EV_OFF_DONE": EV_OFF_DONE, "EV_OFF_RECV": EV_OFF_RECV,
        "TM_LINEAR": TM_LINEAR, "TM_ROOFLINE": TM_ROOFLINE, "TM_TABLE": TM_TABLE,
        "AX_BATCH": AX_BATCH, "AX_PREFILL": AX_PREFILL, "AX_KV": AX_KV,
        "LINE_STEP": LINE_STEP, "LINE_DRAIN": LINE_DRAIN,
        "ACC_PERMILLE": ACC_PERMILLE, "ACC_COUNTS": ACC_COUNTS, "ACC_HISTOGRAM": ACC_HISTOGRAM,
        "SC_STEP": SC_STEP, "SC_KIND": SC_KIND, "SC_UPDATED_STEP": SC_UPDATED_STEP,
        "SC_CLOCK": SC_CLOCK, "SC_DURATION": SC_DURATION, "SC_NUM_REQS": SC_NUM_REQS,
        "SC_PREFILL": SC_PREFILL, "SC_DECODE": SC_DECODE, "SC_NUM_NEW": SC_NUM_NEW,
        "SC_NUM_RESUMED": SC_NUM_RESUMED, "SC_NUM_PREEMPTED": SC_NUM_PREEMPTED,
        "SC_NUM_FINISHED": SC_NUM_FINISHED, "SC_RUNNING": SC_RUNNING, "SC_WAITING": SC_WAITING,
        "SC_FREE_SCHED": SC_FREE_SCHED, "SC_FREE_BLOCKS": SC_FREE_BLOCKS,
        "SC_CACHED_BLOCKS": SC_CACHED_BLOCKS, "SC_QUERIES": SC_QUERIES, "SC_HITS": SC_HITS,
        "SC_P_QUERIES": SC_P_QUERIES, "SC_P_HITS": SC_P_HITS, "SC_SPEC_TOKENS": SC_SPEC_TOKENS,
        "SC_SPEC_ACCEPTED": SC_SPEC_ACCEPTED, "N_STEP_COLS": N_STEP_COLS,
        "RC_STATUS": RC_STATUS, "RC_OUTPUT": RC_OUTPUT, "RC_CACHED": RC_CACHED,
        "RC_CACHED_ALL": RC_CACHED_ALL, "RC_PREEMPTIONS": RC_PREEMPTIONS, "RC_ARRIVAL": RC_ARRIVAL,
        "RC_PICKED_UP": RC_PICKED_UP, "RC_FIRST_SCHED": RC_FIRST_SCHED, "RC_FIRST_TOKEN": RC_FIRST_TOKEN, "RC_FINISH": RC_FINISH,
        "RC_SPEC_DRAFTS": RC_SPEC_DRAFTS, "RC_SPEC_ACCEPTED": RC_SPEC_ACCEPTED,
        "N_REQ_COLS": N_REQ_COLS,
    }


cdef list _free_queue(const BlockPoolC* bp):
    # The free queue head to tail (bp_free_queue).
    cdef block_id_t[::1] out = np.zeros(max(bp.num_free, 1), dtype=np.int32)
    cdef Py_ssize_t n = bp_free_queue(bp, &out[0])
    assert n == bp.num_free, (n, bp.num_free)
    return [out[i] for i in range(n)]


cdef class BlockPool:
    """A vLLM block pool, for tests and inspection.

    Parameters
    ----------
    num_blocks : int
        Blocks in the pool including the null block 0.
    enable_caching : bool
        Prefix caching on.
    far_map : bool, optional
        Take the path of a key map past the near caches (``BlockPoolC.far_map``) whatever the
        pool's size, so that a small pool tests it too; default: as the size says.

    Notes
    -----
    The replay core uses the C functions directly; this wrapper validates its
    arguments so that tests can drive the pool from Python.
    """

    cdef BlockPoolC c              # the pool

    def __cinit__(self, int num_blocks, bint enable_caching=True, far_map=None):
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (the null block and one usable block)")
        bp_init(&self.c, num_blocks, enable_caching)
        if far_map is not None:
            self.c.far_map = bool(far_map)

    def __dealloc__(self):
        bp_release(&self.c)

    @property
    def num_free(self):
        return self.c.num_free

    @property
    def usage(self):
        return bp_usage(&self.c)

    def get_new_blocks(self, int n):
        """Pop ``n`` blocks from the head of the free queue."""
        if n < 0 or n > self.c.num_free:
            raise ValueError(f"cannot allocate {n} blocks with {self.c.num_free} free")
        cdef block_id_t[::1] out = np.zeros(max(n, 1), dtype=np.int32)
        bp_pop_n(&self.c, &out[0], n)
        return [out[i] for i in range(n)]

    def _check(self, int b):
        if b <= 0 or b >= self.c.num_blocks:
            raise ValueError(f"block id {b} out of range")

    def touch(self, blocks):
        for b in blocks:
            self._check(b)
            bp_touch(&self.c, b)

    def free_blocks(self, ordered_blocks):
        """Free blocks given in eviction order (first evicted first)."""
        cdef block_id_t[::1] arr = np.asarray(list(ordered_blocks)[::-1], dtype=np.int32)
        cdef Py_ssize_t i
        for i in range(arr.shape[0]):
            self._check(arr[i])
            if self.c.blk[arr[i]].ref_cnt <= 0:
                raise ValueError(f"block {arr[i]} is not held")
        if arr.shape[0]:
            bp_free_reversed(&self.c, &arr[0], arr.shape[0])

    def cache_block(self, int b, key):
        """Register held block ``b`` under ``key`` (a non-zero 64-bit integer)."""
        self._check(b)
        if key == 0:
            raise ValueError("key 0 means 'not cached'")
        if self.c.blk[b].key != 0:
            raise ValueError(f"block {b} is already cached")
        bp_cache(&self.c, b, key)

    def lookup(self, key):
        """The first-inserted block cached under ``key``, or None."""
        cdef block_id_t b = bp_lookup(&self.c, key)
        return None if b < 0 else b

    def ref_cnt(self, int b):
        return self.c.blk[b].ref_cnt

    def block_key(self, int b):
        return self.c.blk[b].key

    def free_queue(self):
        """Block ids of the free queue from head to tail."""
        return _free_queue(&self.c)

    def free_queue_backward(self):
        """Block ids of the free queue from tail to head, reading its ring backwards."""
        out = []
        cdef int64_t pos = self.c.q_tail - 1
        cdef int32_t s
        while pos >= self.c.q_head:
            s = <int32_t>(pos & self.c.q_mask)
            if self.c.blk[self.c.queue[s]].qpos == s:
                out.append(self.c.queue[s])
            pos -= 1
        return out

    @property
    def ring_slots(self):
        """Slots of the free queue's ring in use, stale ones included."""
        return self.c.q_tail - self.c.q_head

    @property
    def ring_capacity(self):
        return self.c.q_mask + 1

    def free_blocks_one_by_one(self, ordered_blocks):
        """Free blocks given in eviction order, one call per block (bp_free_one, one cursor)."""
        cdef block_id_t front = bp_head(&self.c)
        blocks = list(ordered_blocks)
        for b in blocks:
            self._check(b)
            if self.c.blk[b].ref_cnt <= 0:
                raise ValueError(f"block {b} is not held")
        for b in blocks:
            bp_free_one(&self.c, b, &front)

    @property
    def cached_free(self):
        """Blocks in the free queue that still carry a key."""
        return self.c.cached_free

    @property
    def evictions(self):
        """Blocks whose keys were dropped when popped for reuse."""
        return self.c.evictions

    def nodes(self, int n_nodes):
        """Room for ``n_nodes`` deferred lists (runs of shared tokens), all empty."""
        if n_nodes < 1 or self.c.n_nodes:
            raise ValueError("nodes: at least one, once")
        bp_nodes(&self.c, n_nodes)

    def _node(self, int node):
        if node < 0 or node >= self.c.n_nodes:
            raise ValueError(f"node {node} out of range")

    def defer_run(self, blocks, keys, int num_tokens, int block_size, int node, keep=None):
        """Defer the held, uncached ``blocks`` (0: skipped) under ``keys`` on ``node``'s list
        (bp_defer_run); ``keep``: 0 skips a block too."""
        self._node(node)
        if len(keys) != len(blocks) or (keep is not None and len(keep) != len(blocks)):
            raise ValueError("one key (and one keep flag) per block")
        for b, key in zip(blocks, keys):
            if b != 0:
                self._check(b)
                if self.c.blk[b].ref_cnt <= 0 or self.c.blk[b].key != 0 or key == 0:
                    raise ValueError(f"block {b} is not held and uncached, or its key is 0")
        cdef int32_t n = len(blocks)
        cdef block_id_t[::1] arr = np.asarray(list(blocks) + [0], dtype=np.int32)
        cdef hash_t[::1] ks = np.asarray(list(keys) + [0], dtype=np.uint64)
        cdef flag_t[::1] kp = np.asarray(list(keep or []) + [0], dtype=np.int8)
        bp_defer_run(&self.c, &arr[0], &ks[0], &kp[0] if keep is not None else NULL, n, num_tokens,
                     block_size, node)

    def deferred(self, int node):
        """The blocks deferred on ``node``, head to tail; checks the list's back links and tags."""
        self._node(node)
        out = []
        cdef block_id_t b = self.c.node_head[node], prev = -1
        while b != -1:
            if self.c.blk[b].dprev != prev or self.c.blk[b].tag != TAG_DEFER - node:
                raise AssertionError(f"block {b}: broken link or tag on node {node}'s list")
            out.append(b)
            prev = b
            b = self.c.blk[b].dnext
        if self.c.node_tail[node] != prev:
            raise AssertionError(f"node {node}'s tail is not its last block")
        return out

    def materialize(self, int node):
        """Every block deferred on ``node`` gets its key in the map (bp_materialize)."""
        self._node(node)
        bp_materialize(&self.c, node)

    def key_deferred(self, int b):
        """The deferred block ``b``'s key goes into the map (bp_key_deferred)."""
        self._check(b)
        if self.c.blk[b].key == 0 or self.c.blk[b].tag > TAG_DEFER:
            raise ValueError(f"block {b} is not deferred")
        bp_key_deferred(&self.c, b)

    def key_tokens(self, int b):
        return self.c.blk[b].key_tokens


cdef class KVCache:
    """A KV-cache manager with its own requests, driven from Python (tests, tools).

    Parameters
    ----------
    num_blocks : int
        Pool size including the null block.
    block_size : int
        Tokens per block of a single full-attention group (ignored with ``groups``).
    max_model_len : int
        Longest sequence.
    requests : list of list of (stream, first, length)
        The prompt segments of every request this manager will see.
    enable_caching : bool
        Prefix caching on.
    watermark_blocks : int
        Blocks kept free when admitting waiting requests.
    groups : list of dict, optional
        Group specs as produced by :func:`aisim.config.kvgroups.resolve_groups`
        (``kind``, ``block_size``, ``window``, ``cacheable``, ``align_mode``,
        ``num_spec``, ``has_ckpt``, ``ckpt_align``, ``admission_cap``,
        ``spec_group``) with ``hash_block_size``, ``sched_block_size``,
        ``fine``, ``retention`` and ``rules`` (or ``release``: that release's
        rules, :func:`aisim.config.versions.core_rules`).

    Notes
    -----
    Mirrors how vLLM's own tests drive ``KVCacheManager``: the caller sets
    ``num_computed_tokens`` and appends outputs between calls.
    """

    cdef KVCacheC c                # the manager
    cdef ReqC* reqs                # [n_reqs] its own requests
    cdef int n_reqs
    cdef object _segments          # keeps the segment arrays alive

    def __cinit__(self, int num_blocks, int block_size, long max_model_len, requests,
                  bint enable_caching=True, int watermark_blocks=0, groups=None,
                  long hash_block_size=0, long sched_block_size=0, bint fine=False,
                  long retention=-1, str release="0.32.0", rules=None, bint eagle=False, long hash_lookahead=0):
        cdef Py_ssize_t i, n = len(requests)
        cdef GroupSpecC specs[MAX_GROUPS]
        if block_size < 1 or max_model_len < 1 or num_blocks < 2:
            raise ValueError("num_blocks >= 2, block_size >= 1 and max_model_len >= 1 are required")
        if groups is None:
            groups = [dict(kind=0, block_size=block_size, window=0, cacheable=True, align_mode=False,
                           num_spec=0, has_ckpt=False, ckpt_align=0, admission_cap=-1, spec_group=0)]
            hash_block_size = sched_block_size = block_size
        specs_from_dicts(groups, specs)
        streams, firsts, lens, offs, cnts = [], [], [], [], []
        for segs in requests:
            offs.append(len(streams))
            cnts.append(len(segs))
            for st, fi, ln in segs:
                if ln <= 0:
                    raise ValueError("segment lengths must be positive")
                streams.append(st)
                firsts.append(fi)
                lens.append(ln)
        self._segments = (np.asarray(streams + [0], np.uint64), np.asarray(firsts + [0], np.int64),
                          np.asarray(lens + [0], np.int64))
        cdef const hash_t[::1] g_str = self._segments[0]
        cdef const tok_t[::1] g_first = self._segments[1]
        cdef const tok_t[::1] g_len = self._segments[2]
        kv_init(&self.c, num_blocks, <int32_t>len(groups), specs, hash_block_size, sched_block_size,
                fine, enable_caching, retention, rules if rules is not None else core_rules(release),
                max_model_len, watermark_blocks, 4)
        self.c.eagle = eagle
        self.c.hash_lookahead = hash_lookahead
        self.c.seg_stream = &g_str[0]
        self.c.seg_first = &g_first[0]
        self.c.seg_len = &g_len[0]
        self.reqs = <ReqC*>mem_calloc(n, sizeof(ReqC))
        self.n_reqs = <int>n
        for i in range(n):
            self.reqs[i].prompt_len = sum(l for _, _, l in requests[i])
            self.reqs[i].max_tokens = max_model_len
            self.reqs[i].seg_off = offs[i]
            self.reqs[i].seg_cnt = cnts[i]
            self.reqs[i].out_stream = (<hash_t>1 << 63) | <hash_t>i
            self.reqs[i].status = ST_WAITING
            self.reqs[i].slot = -1
            kv_acquire_slot(&self.c, &self.reqs[i])

    def __dealloc__(self):
        kv_release(&self.c)
        mem_free(self.reqs)

    cdef ReqC* _req(self, int r) except NULL:
        if r < 0 or r >= self.n_reqs:
            raise IndexError(f"no request {r}")
        return &self.reqs[r]

    @property
    def num_free(self):
        return self.c.pool.num_free

    @property
    def cached_free(self):
        """Blocks in the free queue that still carry a key."""
        return self.c.pool.cached_free

    def free_queue(self):
        """Block ids of the free queue from head to tail."""
        return _free_queue(&self.c.pool)

    def ref_cnt(self, int b):
        return self.c.pool.blk[b].ref_cnt

    def cached_hash_indices(self, int r, int group):
        """Hash-block indices of ``r``'s hashes cached under ``group`` (any block)."""
        cdef ReqC* q = self._req(r)
        hash_extend(&self.c, q, kv_n_hashes(&self.c, q))
        cdef hash_t* hs = kv_hashes(&self.c, q.slot)
        return [j for j in range(kv_n_hashes(&self.c, q))
                if bp_lookup(&self.c.pool, group_key(hs[j], group)) >= 0]

    def block_hashes(self, int r, long num_output=0):
        """``r``'s chained block hashes (``hash_extend``) once it has ``num_output`` output tokens.

        The output count only grows; a later call extends the chain from where the last stopped.
        """
        cdef ReqC* q = self._req(r)
        if num_output < q.num_output:
            raise ValueError("a request's output only grows")
        q.num_output = num_output
        hash_extend(&self.c, q, kv_n_hashes(&self.c, q))
        cdef hash_t* hs = kv_hashes(&self.c, q.slot)
        return [hs[j] for j in range(kv_n_hashes(&self.c, q))]

    def evict_key(self, int r, int group, int hash_index):
        """Drop every block cached under ``r``'s hash ``hash_index`` for ``group`` (tests)."""
        cdef ReqC* q = self._req(r)
        hash_extend(&self.c, q, kv_n_hashes(&self.c, q))
        cdef hash_t key = group_key(kv_hashes(&self.c, q.slot)[hash_index], group)
        cdef block_id_t b = bp_lookup(&self.c.pool, key)
        while b >= 0:
            bp_remove_hashes(&self.c.pool, b)
            b = bp_lookup(&self.c.pool, key)

    def num_tokens(self, int r):
        return num_tokens(self._req(r))

    def set_num_computed(self, int r, long n):
        self._req(r).num_computed = n

    def set_running(self, int r):
        """Mark ``r`` RUNNING (no watermark applies to it)."""
        self._req(r).status = ST_RUNNING

    def append_outputs(self, int r, long n=1):
        """Append ``n`` output tokens (vLLM's append_output_token_ids)."""
        self._req(r).num_output += n

    def new_step(self):
        """A new schedule() step: release copy retentions, forget same-step states."""
        kv_end_schedule(&self.c)
        kv_new_step_starts(&self.c)

    def get_computed_blocks(self, int r):
        """(hit tokens, hit block ids) for one group, or per group with several."""
        cdef ReqC* q = self._req(r)
        cdef tok_t hit = kv_get_computed_blocks(&self.c, q)
        per = [[self.c.groups[g].hit[i] for i in range(self.c.groups[g].hit_n)] for g in range(self.c.n_groups)]
        return hit, (per[0] if self.c.n_groups == 1 else tuple(per))

    def shared_prefix_boundary(self, int r):
        return self._req(r).shared_prefix_boundary

    def allocate_slots(self, int r, long num_new_tokens, long num_new_computed=0,
                       bint full_sequence_must_fit=False, bint has_scheduled_reqs=True,
                       long num_lookahead_tokens=0):
        """vLLM's allocate_slots: the newly allocated block ids (per group with
        several groups), or None when it fails."""
        cdef ReqC* q = self._req(r)
        before = self.blocks(r)
        hits = self.get_hits()
        if not kv_allocate_slots(&self.c, q, num_new_tokens, num_new_computed,
                                 full_sequence_must_fit, has_scheduled_reqs, num_lookahead_tokens, False):
            return None
        after = self.blocks(r)
        if self.c.n_groups == 1:
            before, after, hits = (before,), (after,), (hits,)
        new = tuple([b for b in a if b != 0 and b not in set(bf) and (num_new_computed == 0 or b not in set(h))]
                    for a, bf, h in zip(after, before, hits))
        return new[0] if self.c.n_groups == 1 else new

    def get_hits(self):
        per = [[self.c.groups[g].hit[i] for i in range(self.c.groups[g].hit_n)] for g in range(self.c.n_groups)]
        return per[0] if self.c.n_groups == 1 else tuple(per)

    def blocks(self, int r):
        """The block table of ``r`` (a tuple of tables with several groups)."""
        cdef ReqC* q = self._req(r)
        per = []
        for g in range(self.c.n_groups):
            t = kv_table(&self.c, g, q.slot)
            per.append([t[i] for i in range(self.c.groups[g].table_len[q.slot])])
        return per[0] if self.c.n_groups == 1 else tuple(per)

    def cache_blocks(self, int r, long num_tokens):
        kv_cache_blocks(&self.c, self._req(r), num_tokens)

    def free(self, int r):
        """Free every block of ``r``, tail first, group by group."""
        kv_free(&self.c, self._req(r))
