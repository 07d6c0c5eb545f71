"""A deployment: N replicas of the exact engine behind a router, on one simulated clock.

Each replica is a complete :class:`aisim._core.engine.Engine` (its own scheduler, KV cache and
step time), fed one request at a time (``replica_add``) and stepped one iteration at a time
(``replica_step``; both in engine_replica.pxi).  The event loop: the next event is the earliest
of the next arrival and every busy replica's next iteration start (its clock); an arrival at t
is routed and added before any iteration starting at or after t (the single engine's rule);
ties between replicas go to the lowest index.  An idle replica's clock jumps to the arrival it is given.  A replica's
decisions therefore depend only on the requests routed to it: its decision log equals a
single-engine replay of its share (the tests check it).

The router sees each replica as reported by its iterations: an iteration's effects (block keys
entering or leaving its prefix cache, first tokens, finishes) become visible to arrivals after
the iteration's start, ``view_delay_s`` later with a delay.  The router's own bookings (a
request's load, prefill tokens and active blocks, added when it is routed) are immediate, as in
Dynamo's router (lib/kv-router, ``ActiveSequences``).  Both live in one prefix index of the
trace's prompt blocks (keyindex.pxi): per block id the replicas caching it, kept from the
replicas' block-pool key events (which name a block by the id its request tagged it with), per
node of the prefix tree the replicas holding it active.
"""

from libc.math cimport INFINITY
from libc.string cimport memcpy, memset

import numpy as np

from aisim._core.blockpool cimport TAG_NONE, BlockPoolC, bp_log_keys, bp_lookup
from aisim._core.engine cimport Engine, TraceC, replica_add, replica_end, replica_step, replica_wake

# No next event: a replica's stretch is bounded only by its own requests.
cdef sec_t INF_S = 1e300
from aisim._core.heap cimport HeapC, heap_init, heap_pop, heap_push, heap_release
from aisim._core.kvcache cimport KVCacheC
from aisim._core.kvrows cimport kv_table
from aisim._core.hashing cimport NONE_HASH_SEED, group_key, hash_combine, hash_prompt
from aisim._core.memory cimport mem_calloc, mem_free, mem_grow
from aisim._core.request cimport ReqC
from aisim._core.scheduler cimport BatchC, SchedC, sched_free_held, sched_has_requests, sched_next_landing
from aisim._core.types cimport block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, tok_t
from aisim._core.util cimport __builtin_ctzll, mix64

# Router inputs recorded per decision and replica (Deployment(record_routing=True)), in this order.
ROUTING_FIELDS = ("outstanding_requests", "outstanding_tokens", "overlap_blocks", "overlap_blocks_true",
                  "prefill_tokens", "decode_blocks", "cost")
cdef int N_FIELDS = 7

# ------------------------------------------------------------------ the prefix index

# Block ids are int32 (a block's tag): the index refuses a trace with more distinct prompt blocks.
cdef int64_t INT32_MAX_IDS = 2147483647

include "keyindex.pxi"


# ------------------------------------------------------------------ the router


cdef int _report(RouterC* rt, const TraceC* tr, sec_t stamp, int32_t w, int32_t kind, hash_t value) except -1 nogil:
    """A change replica ``w`` reports: visible at once without a view delay, else queued."""
    cdef DeltaC d
    if rt.delay == 0:
        d.stamp = stamp
        d.replica = w
        d.kind = kind
        d.value = value
        return _apply(rt, tr, &d)
    return _push(&rt.q, stamp, w, kind, value)


cdef int _push(DeltaQC* q, sec_t stamp, int32_t w, int32_t kind, hash_t value) except -1 nogil:
    cdef int64_t i, new
    cdef DeltaC* a
    if q.n == q.cap:
        new = q.cap * 2 if q.cap > 0 else 1024
        a = <DeltaC*>mem_calloc(new, sizeof(DeltaC))
        for i in range(q.n):
            a[i] = q.a[(q.head + i) & (q.cap - 1)]
        mem_free(q.a)
        q.a = a
        q.cap = new
        q.head = 0
    a = &q.a[(q.head + q.n) & (q.cap - 1)]
    a.stamp = stamp
    a.replica = w
    a.kind = kind
    a.value = value
    q.n += 1
    return 0


cdef int _apply(RouterC* rt, const TraceC* tr, const DeltaC* d) except -1 nogil:
    """Make one reported change visible to the router."""
    cdef hash_t bit = (<hash_t>1) << d.replica
    cdef int64_t g, p
    cdef int32_t* c
    cdef NodeC* nd
    cdef PrefixIndexC* x = &rt.idx
    if d.kind == DK_KEY_ADD:
        x.cm[d.value] |= bit
    elif d.kind == DK_KEY_DEL:
        x.cm[d.value] &= ~bit
    elif d.kind == DK_FIRST:
        g = <int64_t>d.value
        rt.pf_toks[d.replica] -= rt.booked_pf[g]
        rt.pf_open[g] = 0
    else:
        g = <int64_t>d.value
        rt.out_reqs[d.replica] -= 1
        rt.out_toks[d.replica] -= tr.prompt_len[g] + tr.max_tokens[g]
        if rt.kv:
            # Its nodes are no longer held by it: a node no outstanding request on the replica
            # passes through stops counting its blocks as active there.
            for p in range(rt.path_off[g], rt.path_off[g + 1]):
                nd = &x.node[rt.path[p]]
                c = &x.cnt[<int64_t>nd.crow * x.n_rep + d.replica]
                c[0] -= 1
                if c[0] == 0:
                    rt.act_n[d.replica] -= nd.n
                    nd.am &= ~bit
                    if nd.am == 0:
                        index_drop_row(x, nd)
    return 0


cdef int _apply_visible(RouterC* rt, const TraceC* tr, sec_t t) except -1 nogil:
    """Everything reported by iterations that started before ``t - view_delay_s``."""
    cdef DeltaQC* q = &rt.q
    while q.n > 0 and (rt.delay == 0 or q.a[q.head].stamp < t - rt.delay):
        _apply(rt, tr, &q.a[q.head])
        q.head = (q.head + 1) & (q.cap - 1)
        q.n -= 1
    return 0


cdef void _kv_scores(RouterC* rt, const TraceC* tr, int64_t g) noexcept nogil:
    """Dynamo's classic KV-router cost for every replica (lib/kv-router scheduling/selector.rs,
    DefaultWorkerSelector::select_worker; research notes 1a):
    overlap_w = leading prompt blocks replica w caches;
    prefill_tokens_w = booked prefill tokens + max(0, prompt - overlap_w * B);
    decode_blocks_w = distinct active prompt blocks on w + this request's blocks not among them;
    cost_w = weight * prefill_tokens_w / B + decode_blocks_w.
    The prompt's blocks are read along its path in the prefix index until no replica's cached
    run goes on; the blocks active on w are the leading nodes w has active (a request holds whole
    paths, so what is active on a replica is closed under prefixes)."""
    cdef int32_t w, n = rt.n_rep
    cdef int64_t p, j = 0, t, L = rt.key_off[g + 1] - rt.key_off[g]
    cdef hash_t alive = (<hash_t>-1) if n == 64 else ((<hash_t>1) << n) - 1
    cdef hash_t m, a
    cdef tok_t prompt = tr.prompt_len[g], new_tok
    cdef const NodeC* nd
    cdef const hash_t* cm
    cdef PrefixIndexC* x = &rt.idx
    for w in range(n):
        rt.overlap[w] = 0
        rt.cover[w] = 0
    for p in range(rt.path_off[g], rt.path_off[g + 1]):
        nd = &x.node[rt.path[p]]
        a = nd.am
        while a != 0:
            rt.cover[__builtin_ctzll(a)] += nd.n
            a &= a - 1
        if alive != 0:
            cm = &x.cm[nd.first]
            for t in range(nd.n):
                m = alive & ~cm[t]  # the replicas whose cached run ends at block j
                while m != 0:
                    rt.overlap[__builtin_ctzll(m)] = j
                    m &= m - 1
                alive &= cm[t]
                if alive == 0:
                    break
                j += 1
        elif nd.am == 0:
            break
    while alive != 0:  # cached through the whole prompt
        rt.overlap[__builtin_ctzll(alive)] = j
        alive &= alive - 1
    for w in range(n):
        new_tok = prompt - rt.overlap[w] * rt.block
        if new_tok < 0:
            new_tok = 0
        rt.cost[w] = (rt.weight * (<double>(rt.pf_toks[w] + new_tok)) / <double>rt.block
                      + <double>(rt.act_n[w] + L - rt.cover[w]))


cdef int32_t _least(const int64_t* load, int32_t n) noexcept nogil:
    """The replica of least ``load`` (outstanding requests or tokens), ties to the lowest index."""
    cdef int32_t w, best = 0
    for w in range(1, n):
        if load[w] < load[best]:
            best = w
    return best


cdef int32_t _cheapest(const RouterC* rt) noexcept nogil:
    cdef int32_t w, best = 0
    for w in range(1, rt.n_rep):
        if rt.cost[w] < rt.cost[best]:
            best = w
    return best


cdef int32_t _choose(RouterC* rt, const TraceC* tr, int64_t g) noexcept nogil:
    cdef int32_t w, s
    cdef int64_t least
    cdef hash_t z
    if rt.kind == RT_ROUND_ROBIN:
        w = <int32_t>(rt.rr % rt.n_rep)
        rt.rr += 1
        return w
    if rt.kind == RT_RANDOM:
        rt.rng += <hash_t>0x9e3779b97f4a7c15
        z = mix64(rt.rng)
        return <int32_t>(((z >> 32) * <hash_t>rt.n_rep) >> 32)
    if rt.kind == RT_LEAST_LOADED:
        return _least(rt.out_toks if rt.by_tokens else rt.out_reqs, rt.n_rep)
    if rt.kind == RT_KV_AWARE:
        return _cheapest(rt)
    # session_affinity: the replica of the session's first turn, unless it holds more than
    # ``slack`` outstanding requests above the least loaded replica; then the fallback's choice,
    # which the session follows from then on.
    s = <int32_t>rt.session[g]
    if s >= 0 and rt.sticky[s] >= 0:
        w = rt.sticky[s]
        least = rt.out_reqs[_least(rt.out_reqs, rt.n_rep)]
        if rt.out_reqs[w] <= least + rt.slack:
            return w
    w = _cheapest(rt) if rt.fallback == RT_KV_AWARE else _least(rt.out_toks if rt.by_tokens else rt.out_reqs, rt.n_rep)
    if s >= 0:
        rt.sticky[s] = w
    return w


cdef int _book(RouterC* rt, const TraceC* tr, int64_t g, int32_t w) except -1 nogil:
    """The router's own accounting of a request it sent to ``w`` (immediate)."""
    cdef hash_t bit = (<hash_t>1) << w
    cdef int64_t p, pf
    cdef int32_t* c
    cdef NodeC* nd
    cdef PrefixIndexC* x = &rt.idx
    rt.out_reqs[w] += 1
    rt.out_toks[w] += tr.prompt_len[g] + tr.max_tokens[g]
    if not rt.kv:
        return 0
    pf = tr.prompt_len[g] - rt.overlap[w] * rt.block
    rt.booked_pf[g] = pf if pf > 0 else 0
    rt.pf_toks[w] += rt.booked_pf[g]
    rt.pf_open[g] = 1
    for p in range(rt.path_off[g], rt.path_off[g + 1]):
        nd = &x.node[rt.path[p]]
        if nd.crow < 0:
            nd.crow = index_row(x)
        c = &x.cnt[<int64_t>nd.crow * x.n_rep + w]
        c[0] += 1
        if c[0] == 1:
            rt.act_n[w] += nd.n
            nd.am |= bit
    return 0


cdef inline void _tag(const RouterC* rt, ReqC* r, int64_t g) noexcept nogil:
    """Give request ``g`` on a replica the router's ids of its prompt blocks, which its cache's
    key events then carry (kvcache.pyx _cache_group)."""
    if rt.kv:
        r.tag_off = rt.key_off[g]
        r.tag_n = <int32_t>(rt.key_off[g + 1] - rt.key_off[g])
        r.tag_look = rt.quoted[g]


cdef inline hash_t _pool_key(const RouterC* rt, int64_t k) noexcept nogil:
    """Prompt block ``k``'s key in a replica's pool (its group's key over the chain hash)."""
    return group_key(rt.keys[k], rt.group)


# ------------------------------------------------------------------ the deployment


def _c(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


include "deploy_setup.pxi"


cdef object _arr_i32(int32_t* a, int64_t n):
    return np.array(<int32_t[:n]>a, copy=True) if n else np.zeros(0, np.int32)


cdef class Deployment:
    """N replicas of one engine configuration behind a router, replayed once; or, disaggregated,
    a prefill pool and a decode pool, each behind its own router, joined by a KV transfer link.

    Made by ``aisim.replay.run_deployment``, which validates every argument (a time-clocked,
    open-loop trace; at most 64 replicas a pool); this class trusts them.
    """

    cdef RouterC rt              # the router (the prefill pool's when disaggregated)
    cdef RouterC rd              # the decode pool's router (disaggregated)
    cdef TraceC tr
    cdef tuple engines           # the replicas: the prefill pool's first, then the decode pool's
    cdef list _keep
    cdef int32_t n_all           # replicas in all
    cdef int64_t** rep_glob      # [n_all] trace index of each replica's k-th request
    cdef int64_t* rep_n
    cdef int64_t* rep_cap
    cdef int32_t* route          # [n] replica of each request (its prefill replica when disaggregated)
    cdef sec_t* ready            # [n_all] when each replica next iterates (-1: idle), kept by _touch
    cdef bint record
    cdef double* rec             # [n * n_rep * N_FIELDS] router inputs (record_routing)
    cdef bint done
    cdef bint macro              # replicas run quiet stretches (see __init__)
    # disaggregated prefill/decode
    cdef bint pd
    cdef LinkC link
    cdef HeapC ev                # routing (tie 2g) and landing (tie 2g + 1) events, by time
    cdef int32_t* route_d        # [n] decode replica (-1: none)
    cdef sec_t* routed_d         # [n] when the decode router placed it
    cdef sec_t* xfer_s           # [n] transfer seconds
    cdef int64_t* xfer_blocks    # [n] blocks moved
    cdef req_t* p_slot           # [n] its slot on its prefill replica
    cdef int64_t max_conc        # the client's cap on requests in flight (0: none)
    cdef int64_t conc_free       # sends the cap allows before the first finish
    cdef int64_t conc_n          # finishes seen (the tie of their releases)
    cdef HeapC conc              # finishes' releases of the cap, by the time their replica saw them
    cdef sec_t* sent             # [n] when the client sent each request (its arrival, or later under a cap)
    cdef HeapC rel               # closed loop: next turns a finish released, by (send time, trace index)

    def __cinit__(self):
        self.rep_glob = NULL
        self.done = True

    def __init__(self, config not None, trace not None, int n_rep, dict router not None,
                 bint record_events=False, bint record_routing=False, dict pd=None, int64_t max_concurrency=0,
                 bint macro_steps=True):
        """Build the replicas and the router(s).

        Parameters
        ----------
        config : aisim.core_input.CoreConfig
            Every replica's engine (the prefill pool's when disaggregated).
        trace : aisim.core_input.CoreTrace
            Time-clocked; with ``next_turn`` and ``think_s``, a closed loop: a session's next turn is
            sent (and routed) when its previous turn finishes, plus its think time.
        n_rep : int
            Replicas (the prefill pool's when disaggregated), 1 to 64.
        router : dict
            ``kind`` (RouterKind), ``by_tokens``, ``weight``, ``fallback``, ``slack``,
            ``view_delay_s``, ``seed``, ``session`` (int64 per request, -1: none),
            ``n_sessions``, ``group`` and ``block`` (the full-attention group's id and block
            size; -1 without one).
        pd : dict, optional
            Disaggregated: ``config`` (the decode pool's CoreConfig), ``replicas``, ``router``
            (as ``router``), ``bandwidth`` (bytes per second, may be inf), ``latency_s``,
            ``missing`` (move only the blocks the decode replica lacks) and ``block_bytes``.
        max_concurrency : int
            The client sends at most this many requests at a time (0: no cap), as
            ``Engine(max_concurrency=...)`` does for one engine: a request due while that many are
            in flight (routed and not finished: on its decode replica when disaggregated) is sent,
            in trace order, when one finishes.
        macro_steps : bool
            A replica replays a quiet stretch of decoding in one move, up to the deployment's next
            event (Engine(macro_steps=...)), when nothing another replica does in the meantime can
            change a decision: a router that reads only its own bookkeeping (requests sent and
            finished), or a KV-aware one that sees every replica's keys at once (no view delay);
            not with disaggregated pools.  The results are byte-identical either way.
        """
        cdef int64_t n = len(trace.prompt_len)
        cdef int32_t w, n_d = pd["replicas"] if pd is not None else 0
        cdef Engine e
        cdef RouterC* rt = &self.rt
        memset(rt, 0, sizeof(RouterC))
        memset(&self.rd, 0, sizeof(RouterC))
        memset(&self.tr, 0, sizeof(TraceC))
        memset(&self.link, 0, sizeof(LinkC))
        self._keep = _borrow_trace(&self.tr, trace)
        _router_init(rt, router, n_rep, config.hash_block_size, &self.tr, self._keep, False)
        self.pd = pd is not None
        self.n_all = n_rep + n_d
        if self.pd:
            _router_init(&self.rd, pd["router"], n_d, pd["config"].hash_block_size, &self.tr, self._keep,
                         pd["missing"])
            self.link.bandwidth = pd["bandwidth"]
            self.link.latency = pd["latency_s"]
            self.link.missing = pd["missing"]
            self.link.block_bytes = pd["block_bytes"]
            heap_init(&self.ev, <int32_t>(2 * n + 1))
        if max_concurrency < 0:
            raise ValueError(f"max_concurrency must be >= 0, got {max_concurrency}")
        self.max_conc = max_concurrency
        self.conc_free = max_concurrency
        heap_init(&self.conc, <int32_t>(n + 1))
        heap_init(&self.rel, <int32_t>(n + 1))
        self.sent = <sec_t*>mem_calloc(n if n else 1, sizeof(sec_t))
        self.route = <int32_t*>mem_calloc(n if n else 1, sizeof(int32_t))
        self.route_d = <int32_t*>mem_calloc(n if n else 1, sizeof(int32_t))
        self.routed_d = <sec_t*>mem_calloc(n if n else 1, sizeof(sec_t))
        self.xfer_s = <sec_t*>mem_calloc(n if n else 1, sizeof(sec_t))
        self.xfer_blocks = <int64_t*>mem_calloc(n if n else 1, sizeof(int64_t))
        self.p_slot = <req_t*>mem_calloc(n if n else 1, sizeof(req_t))
        self.rep_glob = <int64_t**>mem_calloc(self.n_all, sizeof(int64_t*))
        self.rep_n = <int64_t*>mem_calloc(self.n_all, sizeof(int64_t))
        self.rep_cap = <int64_t*>mem_calloc(self.n_all, sizeof(int64_t))
        self.ready = <sec_t*>mem_calloc(self.n_all, sizeof(sec_t))
        for w in range(self.n_all):
            self.ready[w] = -1
        self.record = record_routing
        if record_routing:
            self.rec = <double*>mem_calloc(max(n, 1) * n_rep * N_FIELDS, sizeof(double))
        # A stretch runs one replica's iterations ahead of the others' (up to the next arrival or
        # transfer event).  Exact when what the router sees at the next decision cannot differ:
        # a quiet step reports no finish; the block keys a KV-aware router reads are all applied
        # before a decision when it sees them undelayed (the order among replicas does not change
        # which replica holds which key).
        self.macro = macro_steps and not self.pd and (not rt.kv or rt.delay == 0)
        engines = []
        for w in range(self.n_all):
            e = Engine(config if w < n_rep else pd["config"], record_events=record_events, timed=True,
                       expected=max(n // (n_rep if w < n_rep else n_d), 1), out_rows=1 << 62, replica=True,
                       macro_steps=self.macro)
            if (rt.kv and w < n_rep) or (w >= n_rep and self.rd.kv):
                # Its cache reports key events, its prompt blocks tagged with the router's ids.
                bp_log_keys(&e.kv.pool)
                e.kv.tag_group = (rt if w < n_rep else &self.rd).group
                e.kv.tag_ids = (rt if w < n_rep else &self.rd).kid
                if (rt if w < n_rep else &self.rd).block == e.kv.hash_block_size and e.kv.hash_lookahead == 0:
                    e.kv.pre_hashes = (rt if w < n_rep else &self.rd).keys
            engines.append(e)
        self.engines = tuple(engines)
        self.done = False

    def __dealloc__(self):
        cdef int32_t w
        if self.rep_glob == NULL:
            return
        for w in range(self.n_all):
            mem_free(self.rep_glob[w])
        mem_free(self.rep_glob)
        mem_free(self.rep_n)
        mem_free(self.rep_cap)
        mem_free(self.ready)
        mem_free(self.route)
        mem_free(self.sent)
        mem_free(self.route_d)
        mem_free(self.routed_d)
        mem_free(self.xfer_s)
        mem_free(self.xfer_blocks)
        mem_free(self.p_slot)
        mem_free(self.rec)
        _router_release(&self.rt)
        _router_release(&self.rd)
        heap_release(&self.ev)
        heap_release(&self.conc)
        heap_release(&self.rel)

    cdef int _record(self, int64_t g) except -1:
        """The router inputs of decision ``g``, with the overlap read off each replica's own pool
        (the truth the index must agree with when there is no view delay)."""
        cdef RouterC* rt = &self.rt
        cdef double* row
        cdef int32_t w
        cdef int64_t k, true_n
        cdef Engine e
        for w in range(rt.n_rep):
            row = &self.rec[(g * rt.n_rep + w) * N_FIELDS]
            row[0] = <double>rt.out_reqs[w]
            row[1] = <double>rt.out_toks[w]
            if rt.kv:
                e = <Engine>self.engines[w]
                true_n = 0
                for k in range(rt.key_off[g], rt.key_off[g + 1]):
                    if bp_lookup(&e.kv.pool, _pool_key(rt, k)) < 0:
                        break
                    true_n += 1
                row[2] = <double>rt.overlap[w]
                row[3] = <double>true_n
                row[4] = <double>(rt.pf_toks[w] + max(self.tr.prompt_len[g] - rt.overlap[w] * rt.block, 0))
                row[5] = <double>(rt.act_n[w] + rt.key_off[g + 1] - rt.key_off[g] - rt.cover[w])
                row[6] = rt.cost[w]
        return 0

    cdef int _assign(self, int32_t w, int64_t g) except -1 nogil:
        cdef int64_t new
        if self.rep_n[w] == self.rep_cap[w]:
            new = self.rep_cap[w] * 2 if self.rep_cap[w] > 0 else 1024
            mem_grow(<void**>&self.rep_glob[w], self.rep_cap[w], new, sizeof(int64_t))
            self.rep_cap[w] = new
        self.rep_glob[w][self.rep_n[w]] = g
        self.rep_n[w] += 1
        return 0

    cdef int _collect(self, RouterC* rt, int32_t wl, int32_t w, Engine e, sec_t stamp) except -1:
        """What replica ``w`` (``wl`` in its router's pool) reports after its last iteration; a
        prefill replica's finished requests are routed to the decode pool at their first token."""
        cdef int64_t k, g
        cdef int32_t i, kid
        cdef req_t s
        cdef BatchC* b = e.upd_batch
        cdef const int64_t* glob = self.rep_glob[w]
        cdef const BlockPoolC* pool = &e.kv.pool
        if rt.kv:
            # The cache's key events (vLLM's BlockStored / BlockRemoved), named by the ids their
            # blocks' tags carry; keys that are no prompt block of the trace are not the router's.
            for k in range(pool.ev_n):
                kid = index_id(&rt.idx, pool.ev_key[k], pool.ev_tag[k])
                if kid >= 0:
                    _report(rt, &self.tr, stamp, wl, DK_KEY_ADD if pool.ev_add[k] else DK_KEY_DEL, <hash_t>kid)
            e.kv.pool.ev_n = 0
            if b != NULL:
                for i in range(b.n):
                    s = b.req[i]
                    if e.reqs[s].num_output > 0:
                        g = glob[e.slot_global[s]]
                        if rt.pf_open[g] == 1:
                            rt.pf_open[g] = 2  # reported, not yet visible
                            _report(rt, &self.tr, stamp, wl, DK_FIRST, <hash_t>g)
        if b != NULL:
            for i in range(e.sched.n_finished):
                s = e.sched.finished[i]
                g = glob[e.slot_global[s]]
                _report(rt, &self.tr, stamp, wl, DK_FINISH, <hash_t>g)
                if self.pd and rt == &self.rt and e.reqs[s].held:
                    heap_push(&self.ev, 0, max(e.reqs[s].finish_s, stamp), 2 * g, <req_t>g)
        return 0

    cdef sec_t _ready(self, int32_t w, Engine e) noexcept:
        """When replica ``w`` next iterates (-1: idle).  A decode replica whose only work is waiting
        for transfers (or whose last iteration made no progress while one waits) sleeps until the
        earliest lands."""
        cdef SchedC* sc = &e.sched
        cdef bint busy = e.q_len > 0 or e.open_n > 0 or sched_has_requests(sc)
        if not busy:
            return -1
        if not self.pd or w < self.rt.n_rep or (sc.n_remote == 0 and e.open_n == 0):
            if e.q_len == 0 and not sched_has_requests(sc):
                return max(e.clock, e.slot_time[e.open_q[e.open_head]])  # idle: its API server's next handover
            return e.clock
        if e.stalled == 0 and (e.q_len > 0 or sc.n_running > 0 or sc.finished_pending
                               or sc.n_waiting > sc.n_remote):
            return e.clock
        return max(e.clock, _landing(e))

    cdef int _touch(self, int32_t w) except -1:
        """Replica ``w`` changed (fed, stepped, or freed a held request): when it next iterates.
        No other replica's readiness depends on it."""
        self.ready[w] = self._ready(w, <Engine>self.engines[w])
        return 0

    @property
    def macro_counts(self):
        """Macro-steps of all replicas so far: ``stretches`` and the engine ``steps`` they covered."""
        out = {"stretches": 0, "steps": 0}
        for e in self.engines:
            for k, v in (<Engine>e).macro_counts.items():
                out[k] += v
        return out

    def run(self):
        """Replay the trace through the deployment, once.

        Returns
        -------
        dict
            ``route``: the replica of each request (trace order; its prefill replica when
            disaggregated); ``replicas``: per replica (the prefill pool's first) its ``steps``,
            ``requests`` (its share, in trace order), ``events`` and ``spec`` (as ``Engine.run``
            returns them) and ``index``, the trace indices of its share; ``sent``: when the
            client sent (and the router placed) each request; ``routing``: the
            router inputs per decision (``ROUTING_FIELDS`` x replica), when recorded.
            Disaggregated, also ``decode`` (decode replica, numbered after the prefill pool),
            ``routed_d`` (when the decode router placed it), ``transfer_s`` and
            ``transfer_blocks``.
        """
        cdef RouterC* rt = &self.rt
        cdef const TraceC* tr = &self.tr
        cdef int64_t nxt = 0, n = tr.n, g
        cdef int32_t w, best
        cdef sec_t bc, t, stamp, te, ta, until
        cdef bint released
        cdef req_t s
        cdef Engine e
        if self.done:
            raise RuntimeError("Deployment.run replays once")
        self.done = True
        while True:
            best = -1
            bc = 0
            for w in range(self.n_all):
                t = self.ready[w]
                if t >= 0 and (best < 0 or t < bc):
                    best = w
                    bc = t
            te = self.ev.a[0].key if self.ev.n > 0 else -1
            if tr.follows != NULL:
                while nxt < n and tr.follows[nxt]:
                    nxt += 1  # a next turn: its previous turn's finish sends it
            ta = self._send_time(nxt)
            g = nxt
            # Closed loop: a released next turn goes first when it is due earlier (ties: trace order),
            # as one engine merges them (Engine._run).
            released = self.rel.n > 0 and (ta < 0 or self.rel.a[0].key < ta
                                            or (self.rel.a[0].key == ta and self.rel.a[0].tie < nxt))
            if released:
                ta = self.rel.a[0].key
                g = self.rel.a[0].tie
            if ta >= 0 and (best < 0 or ta <= bc) and (te < 0 or ta <= te):
                # Every iteration starting before ta has run, so every finish by ta is known: the
                # cap's earliest release is the one this request waits for.
                t = ta
                if released:
                    heap_pop(&self.rel)
                elif self.max_conc:
                    if self.conc_free > 0:
                        self.conc_free -= 1
                    else:
                        heap_pop(&self.conc)
                _apply_visible(rt, tr, t)
                if rt.kv:
                    _kv_scores(rt, tr, g)
                if self.record:
                    self._record(g)
                w = _choose(rt, tr, g)
                _book(rt, tr, g, w)
                self._assign(w, g)
                self.route[g] = w
                self.route_d[g] = -1
                self.sent[g] = t
                e = <Engine>self.engines[w]
                s = replica_add(e, tr, g, t, True)
                _tag(rt, &e.reqs[s], g)
                if released:
                    e.reqs[s].arrival_key = t  # a released turn is keyed by its release (engine_client.pxi _pop_release)
                if self.pd:
                    # The prefill replica runs it with max_tokens = 1 (the P/D proxy's request); its
                    # blocks outlive the finish while a decode replica pulls them.
                    e.reqs[s].max_tokens = 1
                    e.reqs[s].held = tr.max_tokens[g] > 1
                    self.p_slot[g] = s
                self._touch(w)
                if not released:
                    nxt += 1
                continue
            if te >= 0 and (best < 0 or te <= bc):
                g = self.ev.a[0].tie
                heap_pop(&self.ev)
                if g % 2 == 0:
                    self._to_decode(g // 2, te)
                else:
                    e = <Engine>self.engines[self.route[g // 2]]
                    replica_wake(e, te)
                    sched_free_held(&e.sched, self.p_slot[g // 2])
                    self._touch(self.route[g // 2])
                continue
            if best < 0:
                if nxt < n:
                    raise RuntimeError(f"deployment stalled: request {nxt} waits for the client's cap with "
                                       "nothing in flight")
                break  # every request sent and finished (a closed loop's last turns included)
            e = <Engine>self.engines[best]
            if bc > e.clock:
                e.clock = bc  # a decode replica waking for a transfer
            # A stretch's iterations all start before the next send or transfer event; and before
            # any other replica's next iteration where that one's reports could reach the router or
            # the client first (a finish releasing a closed-loop turn or the client's cap, or a
            # report the router sees after a delay, in report order).
            until = ta if ta >= 0 else INF_S
            if te >= 0 and te < until:
                until = te
            if self.macro and (self.max_conc or tr.next_turn != NULL or rt.delay > 0):
                for w in range(self.n_all):
                    if w != best and 0 <= self.ready[w] < until:
                        until = self.ready[w]
            replica_step(e, until)
            stamp = e.last_start  # the report of the last iteration (a stretch's last)
            if best < rt.n_rep:
                self._collect(rt, best, best, e, stamp)
            else:
                self._collect(&self.rd, best - rt.n_rep, best, e, stamp)
            if self.max_conc or tr.next_turn != NULL:
                self._release(best, e)
            self._touch(best)
        out = []
        for w in range(self.n_all):
            e = <Engine>self.engines[w]
            replica_end(e)
            idx = np.array(<int64_t[:self.rep_n[w]]>self.rep_glob[w], copy=True) if self.rep_n[w] else \
                np.zeros(0, np.int64)
            out.append({"steps": e.take_steps(), "requests": e.take_requests(), "events": e._events(),
                        "spec": e.spec_counts, "offload": e.offload_counts,
                        "gaps": e.take_gaps(), "index": idx})
        result = {"route": _arr_i32(self.route, n), "replicas": out,
                  "sent": np.array(<sec_t[:n]>self.sent, copy=True) if n else np.zeros(0)}
        if self.pd:
            result["decode"] = _arr_i32(self.route_d, n)
            result["routed_d"] = np.array(<sec_t[:n]>self.routed_d, copy=True) if n else np.zeros(0)
            result["transfer_s"] = np.array(<sec_t[:n]>self.xfer_s, copy=True) if n else np.zeros(0)
            result["transfer_blocks"] = np.array(<int64_t[:n]>self.xfer_blocks, copy=True) if n else \
                np.zeros(0, np.int64)
        if self.record:
            result["routing"] = (np.array(<double[:n * rt.n_rep * N_FIELDS]>self.rec, copy=True)
                                 .reshape(n, rt.n_rep, N_FIELDS) if n else np.zeros((0, rt.n_rep, N_FIELDS)))
        return result

    cdef sec_t _send_time(self, int64_t g) noexcept:
        """When the client sends request ``g`` (-1: not before a finish, or no request left): its
        arrival, or later, the cap's earliest release (vllm/benchmarks/serve.py benchmark: an
        asyncio.Semaphore, released in order)."""
        cdef sec_t a
        if g >= self.tr.n:
            return -1
        a = self.tr.arrival_time[g]
        if self.max_conc == 0 or self.conc_free > 0:
            return a
        if self.conc.n == 0:
            return -1
        return max(a, self.conc.a[0].key)

    cdef int _release(self, int32_t w, Engine e) except -1:
        """What the client does when replica ``w``'s last iteration finished requests (a prefill
        replica's only when no decode follows): each leaves the in-flight count at the replica's
        clock (as one engine's client sees them), and, closed loop, sends its session's next turn
        at its finish plus that turn's think time (engine_client.pxi _release_next_turns)."""
        cdef int32_t i
        cdef int64_t g, nx
        cdef req_t s
        cdef const TraceC* tr = &self.tr
        for i in range(e.sched.n_finished):
            s = e.sched.finished[i]
            if self.pd and w < self.rt.n_rep and e.reqs[s].held:
                continue
            if self.max_conc:
                heap_push(&self.conc, 0, e.clock, self.conc_n, 0)
                self.conc_n += 1
            if tr.next_turn != NULL:
                g = self.rep_glob[w][e.slot_global[s]]
                nx = tr.next_turn[g]
                if nx >= 0:
                    heap_push(&self.rel, 0, e.reqs[s].finish_s + tr.think_s[nx], nx, <req_t>nx)
        return 0

    cdef int _to_decode(self, int64_t g, sec_t t) except -1:
        """Request ``g`` produced its first token on its prefill replica at ``t``: the decode router
        places it, the transfer is priced and the decode replica admits it to wait for the KV."""
        cdef RouterC* rd = &self.rd
        cdef int32_t wl, w
        cdef Engine pe = <Engine>self.engines[self.route[g]]
        cdef Engine de
        cdef req_t s
        cdef ReqC* r
        _apply_visible(rd, &self.tr, t)
        if rd.kv:
            _kv_scores(rd, &self.tr, g)
        wl = _choose(rd, &self.tr, g)
        _book(rd, &self.tr, g, wl)
        w = self.rt.n_rep + wl
        de = <Engine>self.engines[w]
        self.xfer_blocks[g] = _blocks_to_move(&self.link, rd, &pe.kv, &pe.reqs[self.p_slot[g]], &de.kv, g)
        self.xfer_s[g] = _transfer_s(&self.link, self.xfer_blocks[g])
        self.route_d[g] = w
        self.routed_d[g] = t
        self._assign(w, g)
        s = replica_add(de, &self.tr, g, t, False)  # the API server was the prefill replica's
        r = &de.reqs[s]
        _tag(&self.rd, r, g)
        # It carries the prefill replica's first token: the prompt's KV arrives, the rest is local.
        r.num_output = 1
        r.last_token_s = pe.reqs[self.p_slot[g]].first_token_s  # the client's first chunk came from there
        r.remote = 1
        r.remote_s = t + self.xfer_s[g]
        heap_push(&self.ev, 0, r.remote_s, 2 * g + 1, <req_t>g)
        self._touch(w)
        return 0
