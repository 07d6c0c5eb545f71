"""vLLM's v1 scheduler (default text-generation path) over C arrays.

``sched_schedule`` is ``Scheduler.schedule`` and ``sched_update`` is
``Scheduler.update_from_output`` (with ``AsyncScheduler``'s placeholder
bookkeeping when ``async_scheduling`` is on), for every release aisim models
(``conf.rules`` holds the release's rule switches), with speculative
decoding; no connectors, encoders, LoRA or structured output.  The fake model
of the recorded oracle runs is built in: a request scheduled to the end of its
known tokens (not a prefill chunk) samples one token plus the drafts it
accepts (the acceptance rules below), and a request stops only at
``max_tokens`` or ``max_model_len``.

Speculative decoding is a compile-time mode of both functions (the fused type
``spec_mode`` of ``types.pxd``): without it, none of the draft arithmetic runs.

Queues: ``running`` is a list in admission order; ``waiting`` is an FCFS deque
(a ring buffer) or, under the priority policy, a binary heap ordered by
(priority, arrival time, request id) -- ``Request.__lt__``.
"""

from libc.string cimport memcpy, memset

from aisim._core.blockpool cimport bp_usage
from aisim._core.heap cimport heap_init, heap_pop, heap_push, heap_release, heap_remove

from aisim._core.kvcache cimport (
    KVCacheC, kv_acquire_slot, kv_allocate_slots, kv_cache_blocks, kv_end_schedule, kv_free,
    kv_arrive, kv_depart, kv_get_computed_blocks, kv_key_lazy, kv_new_step_starts, kv_release_slot,
)
from aisim._core.request cimport (
    ReqC, ST_FINISHED, ST_PREEMPTED, ST_RUNNING, ST_WAITING,
)
from aisim._core.gaps cimport gaps_add
from aisim._core.memory cimport mem_calloc, mem_free, mem_grow, mem_resize
from aisim._core.hashing cimport hash_extend
from aisim._core.kvrows cimport kv_table
from aisim._core.offload cimport (
    OR_DONE, OR_FLUSH, OR_LOAD, OR_LOOKUP, OR_RECV, OR_STORE, DiskC, DiskConfC, DiskEntC, DiskJobC, ScanMemoC,
    OffChunkC, OffConfC, OffJobC, OffLinkC, OffMapE, OffloadC, OffRecC,
)
from aisim._core.types cimport (
    block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, spec_mode, spec_off_t, spec_on_t, step_t, tok_t, uint32_t,
)
from aisim._core.util cimport __builtin_prefetch, cdiv, ckpt_position_v, mix64, num_tokens, splitmix64, tmax, tmin


cdef tok_t _mamba_block_aligned_split(const SchedC* s, const ReqC* r, tok_t n, tok_t local_hit) noexcept nogil:
    """Scheduler._mamba_block_aligned_split.

    Intermediate prefill chunks end on Mamba block boundaries, and a prefill
    stops where a later request can reuse the state: the last cacheable block
    boundary, the prompt's tail hash boundary (fine-grained hits) and the
    shared-prefix junction.
    """
    cdef const SchedConfC* c = &s.conf
    cdef tok_t start = r.num_computed + local_hit
    cdef tok_t ntok = num_tokens(r)
    cdef tok_t prefill_end = r.prompt_len if r.prompt_len > ntok - 1 else ntok - 1
    cdef tok_t bs = c.cache_block_size
    cdef tok_t h = s.kv.hash_block_size
    cdef tok_t end, last, cp, max_prefill, aligned, tail, junction, best, stop
    cdef bint internal
    cdef int k
    cdef tok_t stops[4]
    if start >= prefill_end:
        return n
    # With the EAGLE drop, full attention prunes the last matching block, so
    # the last cacheable state backs off one block too.
    if c.rules.mamba_split_leaves_last_token:
        last = ckpt_position_v(ntok, bs, c.eagle_drop, c.rules.ckpt_position_rounds_n_under_drop, c.hash_lookahead)
    else:
        last = ntok - ntok % bs
        if c.eagle_drop:
            last = last - bs if last > bs else 0
    cp = ckpt_position_v(prefill_end, (h if c.mamba_partial else s.kv.sched_block_size)
                         if c.rules.mamba_split_ckpt_in_sched_blocks else h,
                         c.eagle_drop, c.rules.ckpt_position_rounds_n_under_drop, c.hash_lookahead)
    end = start + n
    internal = False
    if c.mamba_has_ckpt and end >= prefill_end and c.mamba_ckpt_align > 0:
        # is_mamba_prefill_checkpoint_valid
        internal = (start % h == 0 and cdiv(end, bs) - 2 > ((start - 1) // bs if start > 0 else -1)
                    and start + h <= cp and start < cp < end and (cp - start) % c.mamba_ckpt_align == 0)
    if internal:
        last = 0
    if end < prefill_end:
        max_prefill = c.max_num_scheduled_tokens
        if c.long_prefill_token_threshold > 0:
            max_prefill = tmin(max_prefill, c.long_prefill_token_threshold)
        aligned = end // bs * bs
        if aligned > start or bs <= max_prefill:
            end = aligned
    tail = 0
    if c.mamba_partial and not internal:
        if c.rules.mamba_split_leaves_last_token:
            tail = ckpt_position_v(r.prompt_len, h, c.eagle_drop, c.rules.ckpt_position_rounds_n_under_drop,
                                   c.hash_lookahead)
        else:
            tail = r.prompt_len // h * h
            if tail and c.eagle_drop:
                tail = tail - h if tail > h else 0
    junction = r.shared_prefix_boundary
    stops[0] = (start // bs + 1) * bs if (start % bs != 0 and not internal) else 0
    stops[1] = last
    stops[2] = tail if last < tail < r.prompt_len else 0
    stops[3] = start + (junction - start) // bs * bs if start < junction < end else 0
    best = end
    for k in range(4):
        stop = stops[k]
        if start < stop < end and stop < best:
            best = stop
    return best - start if best > start else 0



# ------------------------------------------------------------------ set-up

cdef int sched_init(SchedC* s, SchedConfC conf, KVCacheC* kv, ReqC* reqs, req_t n_reqs) except -1 nogil:
    memset(s, 0, sizeof(SchedC))
    s.conf = conf
    s.kv = kv
    s.reqs = reqs
    s.n_reqs = n_reqs
    s.running = <req_t*>mem_calloc(n_reqs, sizeof(req_t))
    s.waiting = <req_t*>mem_calloc(n_reqs + 1, sizeof(req_t))
    s.skipped = <req_t*>mem_calloc(n_reqs, sizeof(req_t))
    s.finished = <req_t*>mem_calloc(n_reqs, sizeof(req_t))
    if conf.priority:
        heap_init(&s.wheap, n_reqs)
    s.cap = sched_cap(&s.conf, n_reqs)
    if conf.aware_window > 0:
        s.aware_cached = <tok_t*>mem_calloc(conf.aware_window, sizeof(tok_t))
        s.aware_reqs = <req_t*>mem_calloc(conf.aware_window, sizeof(req_t))
        s.aware_pos = <int32_t*>mem_calloc(conf.aware_window, sizeof(int32_t))
    return 0


cdef int32_t sched_cap(const SchedConfC* conf, int64_t n_reqs) noexcept nogil:
    """Entries a batch needs with ``n_reqs`` request slots: a step schedules at most every running
    request (max_num_seqs of them); priority preemption can list a request once as scheduled and
    once as preempted."""
    cdef int64_t cap = conf.max_num_running_reqs if conf.max_num_running_reqs < n_reqs else n_reqs
    return <int32_t>(cap if cap > 1 else 1)


cdef void sched_release(SchedC* s) noexcept nogil:
    mem_free(s.running)
    mem_free(s.waiting)
    mem_free(s.skipped)
    mem_free(s.finished)
    mem_free(s.aware_cached)
    mem_free(s.aware_reqs)
    mem_free(s.aware_pos)
    heap_release(&s.wheap)
    memset(s, 0, sizeof(SchedC))


cdef int batch_init(BatchC* b, int32_t cap) except -1 nogil:
    memset(b, 0, sizeof(BatchC))
    b.req = <req_t*>mem_calloc(cap, sizeof(req_t))
    b.tokens = <tok_t*>mem_calloc(cap, sizeof(tok_t))
    b.sampled = <flag_t*>mem_calloc(cap, sizeof(flag_t))
    b.decode = <flag_t*>mem_calloc(cap, sizeof(flag_t))
    b.ctx = <tok_t*>mem_calloc(cap, sizeof(tok_t))
    b.spec_m = <tok_t*>mem_calloc(cap, sizeof(tok_t))
    b.spec_a = <tok_t*>mem_calloc(cap, sizeof(tok_t))
    b.padded = <flag_t*>mem_calloc(cap, sizeof(flag_t))
    b.new_req = <req_t*>mem_calloc(cap, sizeof(req_t))
    b.new_computed = <tok_t*>mem_calloc(cap, sizeof(tok_t))
    b.res_req = <req_t*>mem_calloc(cap, sizeof(req_t))
    b.res_computed = <tok_t*>mem_calloc(cap, sizeof(tok_t))
    b.preempted = <req_t*>mem_calloc(cap, sizeof(req_t))
    return 0


cdef int batch_grow(BatchC* b, int32_t old, int32_t cap) except -1 nogil:
    """Room for ``cap`` entries (from ``old``), the entries kept."""
    mem_grow(<void**>&b.req, old, cap, sizeof(req_t))
    mem_grow(<void**>&b.tokens, old, cap, sizeof(tok_t))
    mem_grow(<void**>&b.sampled, old, cap, sizeof(flag_t))
    mem_grow(<void**>&b.decode, old, cap, sizeof(flag_t))
    mem_grow(<void**>&b.ctx, old, cap, sizeof(tok_t))
    mem_grow(<void**>&b.spec_m, old, cap, sizeof(tok_t))
    mem_grow(<void**>&b.spec_a, old, cap, sizeof(tok_t))
    mem_grow(<void**>&b.padded, old, cap, sizeof(flag_t))
    mem_grow(<void**>&b.new_req, old, cap, sizeof(req_t))
    mem_grow(<void**>&b.new_computed, old, cap, sizeof(tok_t))
    mem_grow(<void**>&b.res_req, old, cap, sizeof(req_t))
    mem_grow(<void**>&b.res_computed, old, cap, sizeof(tok_t))
    mem_grow(<void**>&b.preempted, old, cap, sizeof(req_t))
    return 0


cdef void batch_release(BatchC* b) noexcept nogil:
    mem_free(b.req)
    mem_free(b.tokens)
    mem_free(b.sampled)
    mem_free(b.decode)
    mem_free(b.ctx)
    mem_free(b.spec_m)
    mem_free(b.spec_a)
    mem_free(b.padded)
    mem_free(b.new_req)
    mem_free(b.new_computed)
    mem_free(b.res_req)
    mem_free(b.res_computed)
    mem_free(b.preempted)
    memset(b, 0, sizeof(BatchC))


# ------------------------------------------------------------------ waiting queue
# vllm/v1/core/sched/request_queue.py: FCFSRequestQueue is a deque (add =
# append, prepend = appendleft); PriorityRequestQueue is a heap on
# Request.__lt__ (priority, arrival_time, request_id) where prepend is a push.

cdef inline int32_t _ring(const SchedC* s, int32_t i) noexcept nogil:
    return (s.w_head + i) % (s.n_reqs + 1)


cdef void _wq_push_back(SchedC* s, req_t r) noexcept nogil:
    cdef const ReqC* q
    if s.conf.priority:
        # Request.__lt__: priority, then arrival_time, then request_id (as strings).
        q = &s.reqs[r]
        heap_push(&s.wheap, q.priority, q.arrival_key, q.id_rank, r)
        s.n_waiting += 1
    else:
        s.waiting[_ring(s, s.n_waiting)] = r
        s.n_waiting += 1


cdef void _wq_push_front(SchedC* s, req_t r) noexcept nogil:
    if s.conf.priority:
        _wq_push_back(s, r)
    else:
        s.w_head = (s.w_head + s.n_reqs) % (s.n_reqs + 1)
        s.waiting[s.w_head] = r
        s.n_waiting += 1


cdef inline req_t _wq_peek(const SchedC* s) noexcept nogil:
    return s.wheap.a[0].item if s.conf.priority else s.waiting[s.w_head]


cdef req_t _wq_pop(SchedC* s) noexcept nogil:
    cdef req_t r
    if s.conf.priority:
        s.n_waiting -= 1
        return heap_pop(&s.wheap)
    r = s.waiting[s.w_head]
    s.w_head = (s.w_head + 1) % (s.n_reqs + 1)
    s.n_waiting -= 1
    return r


cdef void _wq_remove(SchedC* s, req_t r) noexcept nogil:
    # remove_requests: the others keep their relative order.  Rare (a
    # preempted request finished by its in-flight output), so O(n) is fine.
    cdef int32_t i, j = 0
    cdef req_t x
    if s.conf.priority:
        heap_remove(&s.wheap, r)
        s.n_waiting = s.wheap.n
        return
    for i in range(s.n_waiting):
        x = s.waiting[_ring(s, i)]
        if x != r:
            s.waiting[_ring(s, j)] = x
            j += 1
    s.n_waiting = j


# ------------------------------------------------------------------ public state

cdef int sched_add_request(SchedC* s, req_t r) except -1 nogil:
    kv_arrive(s.kv, &s.reqs[r])  # its lookups may find the keys of the runs it shares from now on
    s.reqs[r].status = ST_WAITING
    if s.reqs[r].remote != 0:
        s.n_remote += 1
    _wq_push_back(s, r)


cdef bint sched_has_unfinished(const SchedC* s) noexcept nogil:
    return s.n_running + s.n_waiting > 0 or (s.off != NULL and s.off.n_parked > 0)


cdef bint sched_has_requests(const SchedC* s) noexcept nogil:
    # Scheduler.has_requests: unfinished requests, or finished ones whose ids
    # the next schedule() still has to report.
    # With a KV connector, also while a transfer is in flight (has_pending_push_work).
    return s.n_running + s.n_waiting > 0 or s.finished_pending or (
        s.off != NULL and (s.off.n_parked > 0 or s.off.n_jobs > 0 or (s.off.disk != NULL and s.off.disk.n_jobs > 0)))


# ------------------------------------------------------------------ schedule()

cdef int _preempt(SchedC* s, BatchC* b, req_t v) except -1 nogil:
    """Scheduler._preempt_request; the caller removed ``v`` from running."""
    cdef ReqC* r = &s.reqs[v]
    kv_key_lazy(s.kv, r)  # its re-admission looks up its own blocks: they need their keys
    kv_free(s.kv, r)
    r.off_inflight = 0
    r.status = ST_PREEMPTED
    r.num_computed = 0
    r.num_spec = 0  # spec_token_ids cleared
    r.num_stale = r.num_in_flight
    r.num_placeholders = 0
    r.num_preemptions += 1
    _wq_push_front(s, v)
    b.preempted[b.n_preempted] = v
    b.n_preempted += 1
    return 0


cdef int32_t _priority_victim(const SchedC* s) noexcept nogil:
    # max(running, key=(priority, arrival_time)): Python's max keeps the first
    # maximal element in list order when keys tie (same arrival step).
    cdef int32_t i, best = 0
    cdef const ReqC* a
    cdef const ReqC* c
    for i in range(1, s.n_running):
        a = &s.reqs[s.running[i]]
        c = &s.reqs[s.running[best]]
        if a.priority > c.priority or (
                a.priority == c.priority and a.arrival_key > c.arrival_key):
            best = i
    return best


cdef void _unschedule(BatchC* b, req_t v, tok_t* token_budget, tok_t* input_budget,
                      tok_t draft_slots) noexcept nogil:
    # A priority victim scheduled earlier in this step gives its tokens back
    # (and its drafts: scheduled_spec_decode_tokens.pop).
    cdef int32_t i, j = 0
    for i in range(b.n):
        if b.req[i] == v:
            token_budget[0] += b.tokens[i]
            input_budget[0] += b.tokens[i] + draft_slots
            b.total_tokens -= b.tokens[i]
        else:
            b.req[j] = b.req[i]
            b.tokens[j] = b.tokens[i]
            b.spec_m[j] = b.spec_m[i]
            b.padded[j] = b.padded[i]
            j += 1
    b.n = j


cdef inline void _emit(BatchC* b, req_t r, tok_t n, bint spec) noexcept nogil:
    # Without speculative decoding the draft arrays stay all zero (batch_init).
    b.req[b.n] = r
    b.tokens[b.n] = n
    if spec:
        b.spec_m[b.n] = 0
        b.spec_a[b.n] = 0
        b.padded[b.n] = 0
    b.n += 1
    b.total_tokens += n


# ------------------------------------------------------------------ acceptance
# The fake model of the recordings (tests/data/oracle/README.md, "Speculative
# decoding"): request i verified for the n-th time with m drafts accepts
# min(m, A(i, n)); A is the request's trace list, the configured counts, a
# histogram draw or the seeded per-position hash rule.

cdef tok_t _accepted(const SchedC* s, req_t i, tok_t m) noexcept nogil:
    """Drafts the model accepts of ``m`` at request ``i``'s next verification."""
    cdef const SchedConfC* c = &s.conf
    cdef const ReqC* r = &s.reqs[i]
    cdef int64_t n = r.num_verifications
    cdef hash_t h, v
    cdef tok_t a = 0, j
    cdef int32_t p
    if r.acc_cnt > 0:
        a = c.acc_list[r.acc_off + n % r.acc_cnt]
    elif c.acc_kind == ACC_COUNTS:
        a = c.acc_table[n % c.acc_n]
    else:
        h = splitmix64(splitmix64(c.acc_seed_mix ^ <hash_t>r.trace_index) ^ <hash_t>n)
        if c.acc_kind == ACC_HISTOGRAM:
            # A uniform 53-bit draw against the cumulative thresholds.
            v = h >> 11
            while a < c.acc_n - 1 and <int64_t>v >= c.acc_table[a]:
                a += 1
        else:
            # Leading positions j < m with sm(h ^ j) % 1000 < permille[min(j, len - 1)].
            for j in range(m):
                p = <int32_t>(j if j < c.acc_n else c.acc_n - 1)
                if <int64_t>(splitmix64(h ^ <hash_t>j) % 1000) >= c.acc_table[p]:
                    break
                a += 1
    return a if a < m else m


cdef int sched_schedule(SchedC* s, BatchC* b) except -1 nogil:
    """One call of Scheduler.schedule(); fills ``b`` and advances the requests."""
    # One inline body, specialised: without speculative decoding its draft
    # arithmetic folds away.
    if s.conf.num_spec_tokens > 0:
        return _schedule(s, b, <spec_on_t*>NULL)
    return _schedule(s, b, <spec_off_t*>NULL)


# The waiting pass: compiled into this module.
include "waiting_pass.pxi"
# KV offload behind the GPU cache, and its waiting pass: compiled into this module.
include "offload.pxi"
include "offload_map.pxi"
include "offload_worker.pxi"
include "offload_fence.pxi"
include "offload_disk.pxi"
include "offload_pass.pxi"


cdef int _end_schedule(SchedC* s, BatchC* b, spec_mode* mode) except -1 nogil:
    """The end of Scheduler.schedule: copy-on-write retentions released, then
    _update_after_schedule (and AsyncScheduler's placeholders) for every entry of ``b``."""
    cdef bint spec = spec_mode is spec_on_t
    cdef SchedConfC* c = &s.conf
    cdef tok_t k = c.num_spec_tokens if spec else 0
    cdef tok_t computed_before
    cdef int32_t i
    cdef ReqC* r
    # Copy-on-write retentions are released once the step's copies are
    # issued (Scheduler.schedule -> _free_cow_retained_blocks).
    kv_end_schedule(s.kv)
    if s.off != NULL:
        # The KV connector's metadata is built before _update_after_schedule.
        off_build_meta(s, b)

    # ---- _update_after_schedule (+ AsyncScheduler placeholders)
    b.decode_tokens = 0
    for i in range(b.n):
        r = &s.reqs[b.req[i]]
        computed_before = r.num_computed
        r.num_computed += b.tokens[i]
        r.num_in_flight += b.tokens[i]
        r.is_prefill_chunk = r.num_computed < num_tokens(r) + r.num_placeholders
        if not r.is_prefill_chunk:
            r.off_inflight = 0  # out of Scheduler._inflight_prefills
        b.sampled[i] = not r.is_prefill_chunk
        b.decode[i] = computed_before + 1 >= num_tokens(r) + r.num_placeholders
        if b.decode[i]:
            b.decode_tokens += b.tokens[i]
        b.ctx[i] = r.num_computed
        if spec and b.spec_m[i] > 0:
            if b.padded[i]:
                # -1 padding: verified like drafts, never accepted, not a verification.
                s.padded_requests += 1
                s.padded_tokens += b.spec_m[i]
            else:
                # The model runs the batch: how many drafts it accepts is fixed now.
                b.spec_a[i] = _accepted(s, b.req[i], b.spec_m[i])
                r.num_verifications += 1
                r.spec_accepted += b.spec_a[i]
                b.spec_accepted += b.spec_a[i]
                s.verifications += 1
            r.spec_drafts += b.spec_m[i]
            b.spec_tokens += b.spec_m[i]
        if c.async_scheduling and not r.is_prefill_chunk:
            # One sampled token plus the scheduled drafts are in flight; vLLM
            # puts k -1 placeholders in spec_token_ids for the next step.
            if spec:
                r.num_placeholders += 1 + b.spec_m[i]
                r.num_spec = k
            else:
                r.num_placeholders += 1
    s.finished_pending = False
    b.free_after_schedule = s.kv.pool.num_free
    return 0


cdef int sched_admit_waiting(SchedC* s, BatchC* b, tok_t lpt) except -1 nogil:
    """The waiting pass of a step whose running pass scheduled the ``b.total_tokens`` of ``b``
    without preempting (no drafts): admissions are appended to ``b``.  ``lpt`` is the step's
    long-prefill threshold (``sched_step_lpt`` before the running pass)."""
    return _waiting_pass(s, b, s.conf.max_num_scheduled_tokens - b.total_tokens,
                         s.conf.max_num_batched_tokens - b.total_tokens, lpt, False, b.n, <spec_off_t*>NULL)


cdef int sched_end_schedule(SchedC* s, BatchC* b) except -1 nogil:
    """The end of a step's schedule() after ``sched_admit_waiting`` (no drafts)."""
    return _end_schedule(s, b, <spec_off_t*>NULL)


cdef tok_t sched_step_lpt(const SchedC* s) noexcept nogil:
    """This step's long-prefill threshold (0: none), from the requests eligible now."""
    return _step_lpt(s)


cdef inline tok_t _step_lpt(const SchedC* s) noexcept nogil:
    # Long-prefill threshold, once per step, only with more than one eligible
    # request (Scheduler.schedule), and only with chunked prefill on under
    # long_prefill_cap_needs_chunked_prefill; with the optional fair-share floor.
    cdef const SchedConfC* c = &s.conf
    cdef int32_t eligible = s.n_running + s.n_waiting
    cdef tok_t lpt = c.long_prefill_token_threshold if eligible > 1 else 0
    if c.rules.long_prefill_cap_needs_chunked_prefill and not c.chunked_prefill:
        lpt = 0
    if lpt > 0 and c.adaptive_threshold:
        if c.max_num_batched_tokens // eligible > lpt:
            lpt = c.max_num_batched_tokens // eligible
    return lpt


cdef int _schedule(SchedC* s, BatchC* b, spec_mode* mode) except -1 nogil:
    cdef bint spec = spec_mode is spec_on_t
    cdef SchedConfC* c = &s.conf
    cdef tok_t token_budget = c.max_num_scheduled_tokens
    cdef tok_t input_budget = c.max_num_batched_tokens
    cdef tok_t draft_slots = c.draft_slots if spec else 0
    cdef tok_t lpt, n, n_spec
    cdef int32_t req_index = 0, vi, i, n_running_sched
    cdef req_t ri, v
    cdef ReqC* r
    cdef bint ok, prefill_scheduled = False

    b.n = 0
    b.total_tokens = 0
    b.n_new = 0
    b.n_resumed = 0
    b.n_preempted = 0
    b.queries = b.hits = b.requests = 0
    b.p_queries = b.p_hits = b.p_requests = 0
    b.spec_tokens = b.spec_accepted = 0
    kv_new_step_starts(s.kv)

    lpt = _step_lpt(s)

    # ---- pass 1: running requests, in list order
    while req_index < s.n_running and token_budget > 0:
        ri = s.running[req_index]
        r = &s.reqs[ri]
        if req_index + 2 < s.n_running:
            # The request after next: its fields are read here and its KV state in
            # kv_allocate_slots; a deployment's replicas take turns, so it is seldom cached.
            __builtin_prefetch(&s.reqs[s.running[req_index + 2]])
            __builtin_prefetch(<char*>&s.reqs[s.running[req_index + 2]] + 64)
        # Every scheduled request takes draft_slots of the input budget too.
        if input_budget <= draft_slots:
            break
        # Async guard: never schedule past max_tokens while outputs are pending
        # (placeholders count the drafts, so this holds even if all are rejected).
        if r.num_placeholders > 0 and (
                r.num_computed + 2 - r.num_placeholders >= r.prompt_len + r.max_tokens):
            req_index += 1
            continue
        # num_tokens_with_spec: the drafts are scheduled with the next token.
        n = num_tokens(r) + r.num_placeholders - r.num_computed
        if spec:
            n += r.num_spec
        if 0 < lpt < n:
            n = lpt
        n = tmin(n, tmin(token_budget, input_budget - draft_slots))
        # Leave room for the sampled token (num_sampled_tokens_per_step = 1).
        n = tmin(n, c.max_model_len - r.num_computed - 1)
        if c.mamba_split:
            n = _mamba_block_aligned_split(s, r, n, 0)
        if n <= 0:
            req_index += 1
            continue
        while True:
            ok = kv_allocate_slots(s.kv, r, n, 0, False, True, c.num_lookahead, False) == 1
            if ok:
                break
            # Preempt: FCFS takes the tail of running; priority the max of
            # (priority, arrival), adjusting the index and budgets.
            if c.priority:
                vi = _priority_victim(s)
                v = s.running[vi]
                for i in range(vi, s.n_running - 1):
                    s.running[i] = s.running[i + 1]
                s.n_running -= 1
                if vi < req_index:
                    req_index -= 1
                _unschedule(b, v, &token_budget, &input_budget, draft_slots)
            else:
                if s.off != NULL and c.async_scheduling and s.reqs[s.running[s.n_running - 1]].num_in_flight > 0:
                    # Scheduler.defer_block_free (async, a consumer connector: kv_both) and
                    # _request_blocks_can_be_freed: a victim in the step in flight is not preempted.
                    break
                s.n_running -= 1
                v = s.running[s.n_running]
            _preempt(s, b, v)
            if v == ri:
                break
        if not ok:
            # The request preempted itself.  The running pass stops here, or
            # (running_pass_continues_after_self_preemption) goes on with the
            # requests after it, which may use the blocks just freed (vllm/v1/core/sched/scheduler.py,
            # Scheduler.schedule: `continue` when the request is PREEMPTED).
            # Only the priority policy can leave requests after it: FCFS
            # preempts from the tail.  _preempt already removed it from
            # running, so req_index points at the next request.
            if c.rules.running_pass_continues_after_self_preemption and r.status == ST_PREEMPTED:
                continue
            break
        _emit(b, ri, n, spec)
        token_budget -= n
        input_budget -= n + draft_slots
        req_index += 1
        if not spec:
            continue
        # is_prefill_chunk from the request's previous scheduling.
        prefill_scheduled = prefill_scheduled or r.is_prefill_chunk
        if r.num_spec > 0:
            # The drafts that fit into n after the known tokens (and placeholders);
            # spec_token_ids is cleared either way.
            n_spec = n + r.num_computed - num_tokens(r) - r.num_placeholders
            if n_spec > 0:
                b.spec_m[b.n - 1] = tmin(n_spec, r.num_spec)
            r.num_spec = 0
    n_running_sched = b.n

    # ---- pass 2: waiting requests, only if nothing was preempted
    if s.off != NULL:
        s.off.n_recs = 0
        s.off.step_evicted = 0
        s.off.cur_step = b.step
        if b.n_preempted == 0:
            _waiting_pass_off(s, b, token_budget, input_budget, lpt)
    elif b.n_preempted == 0:
        _waiting_pass(s, b, token_budget, input_budget, lpt, prefill_scheduled, n_running_sched, mode)
    _end_schedule(s, b, mode)
    return 0


# KV from a prefill replica (disaggregated prefill/decode): compiled into this module.
include "remote_kv.pxi"


# ------------------------------------------------------------------ update_from_output()

cdef bint _spec_output(SchedC* s, ReqC* r, tok_t m, tok_t a, bint stale, bint was_running,
                       sec_t end_s) except -1 nogil:
    """A sampled output with speculative decoding on: 1 + a tokens after m drafts.

    The rejected drafts (m may be 0, or vLLM's -1 padding) roll back what
    schedule() advanced (a stale count predates the preemption's reset and is
    not applied); the tokens are appended one by one and check_stop drops the
    rest at ``max_tokens`` or ``max_model_len`` (Scheduler.update_from_output,
    _update_request_with_output).  Returns whether the request stopped.
    """
    cdef const SchedConfC* c = &s.conf
    cdef tok_t gen = 1 + a, appended = 0
    cdef bint stopped = False
    if m > 0:
        if not stale:
            if r.num_computed > 0:
                r.num_computed -= m - a
            if r.num_placeholders > 0:
                r.num_placeholders -= m - a
        # SpecDecodingStats (padding included, as vLLM counts it).
        s.stat_drafts += 1
        s.stat_draft_tokens += m
        s.stat_accepted += a
    while appended < gen:
        r.num_output += 1
        appended += 1
        if r.num_output == 1:
            r.first_token_s = end_s
        if num_tokens(r) >= c.max_model_len or r.num_output >= r.max_tokens:
            stopped = True
            break
    if c.rules.spec_output_caches_final_blocks:
        if stopped and not stale:
            # num_computed_tokens covers every new token but the last.
            r.num_computed -= gen - appended
        if not stale and r.num_placeholders > 0:
            r.num_placeholders -= gen  # every returned token, trimmed ones too
        # With speculative decoding every output caches what it made final,
        # before a finished request is freed.
        if not stale and was_running:
            kv_cache_blocks(s.kv, r, r.num_computed - r.num_in_flight)
    elif c.async_scheduling:
        # AsyncScheduler._update_request_with_output (without spec_output_caches_final_blocks):
        # the kept tokens.
        if not stale:
            r.num_placeholders -= appended
        if was_running:
            kv_cache_blocks(s.kv, r, r.num_computed - r.num_placeholders)
    return stopped


cdef int sched_update(SchedC* s, const BatchC* b) except -1 nogil:
    """Scheduler.update_from_output for batch ``b`` with the fake model's tokens."""
    if s.conf.num_spec_tokens > 0:
        return _update(s, b, <spec_on_t*>NULL)
    return _update(s, b, <spec_off_t*>NULL)


cdef int _update(SchedC* s, const BatchC* b, spec_mode* mode) except -1 nogil:
    """Scheduler.update_from_output for batch ``b`` with the fake model's tokens.

    A request verified with m drafts gets 1 + a tokens (a decided when the batch
    was formed); the rejected drafts roll ``num_computed_tokens`` (and async
    placeholders) back.  Tokens are appended one by one and the request stops
    at ``max_tokens`` or ``max_model_len``, dropping the rest.  Tokens produced
    by ``b`` are stamped with ``b.end_s``.  A synchronous engine then hands
    every request of the batch k new drafts (``EngineCore.post_step``).
    """
    cdef bint spec = spec_mode is spec_on_t
    cdef const SchedConfC* c = &s.conf
    cdef int32_t i, j
    cdef req_t ri
    cdef ReqC* r
    cdef bint stale, was_running, stopped
    cdef int32_t n_stopped_running = 0
    s.n_finished = 0
    for i in range(b.n):
        ri = b.req[i]
        r = &s.reqs[ri]
        if r.status == ST_FINISHED:
            continue  # freed and gone from Scheduler.requests
        r.num_in_flight -= b.tokens[i]
        stale = False
        if r.num_stale > 0:
            stale = True
            r.num_stale -= b.tokens[i]
        if not b.sampled[i]:
            continue
        was_running = r.status == ST_RUNNING
        # One streamed output (all of its tokens: 1 + the accepted drafts) at the end of the step:
        # the client's inter-token latency is the gap to the request's previous one
        # (vllm/benchmarks/lib/endpoint_request_func.py: one itl entry per chunk after the first).
        if r.num_output > 0 and s.gaps != NULL:
            gaps_add(s.gaps, b.end_s - r.last_token_s, 1)
        r.last_token_s = b.end_s
        if spec:
            stopped = _spec_output(s, r, b.spec_m[i], b.spec_a[i], stale, was_running, b.end_s)
        else:
            # _update_request_with_output with one sampled token, then check_stop
            # (EOS is ignored); AsyncScheduler resolves its placeholder and caches.
            r.num_output += 1
            if r.num_output == 1:
                r.first_token_s = b.end_s
            if c.async_scheduling:
                if not stale:
                    r.num_placeholders -= 1
                if was_running:
                    kv_cache_blocks(s.kv, r, r.num_computed - r.num_placeholders)
            elif c.mamba_output_caching and was_running and not stale:
                # Scheduler.update_from_output (mamba_sync_output_caches_final_blocks): the
                # synchronous engine with Mamba layers publishes the final states, before a
                # finished request is freed.
                kv_cache_blocks(s.kv, r, r.num_computed - r.num_in_flight)
            stopped = num_tokens(r) >= c.max_model_len or r.num_output >= r.max_tokens
        if stopped:
            # _free_request: blocks back to the pool now; a prefill replica's request whose KV a
            # decode replica will pull keeps them until the transfer is done (the KV connector's
            # request_finished answers delay_free_blocks: Scheduler._free_request ->
            # _connector_finished).
            r.status = ST_FINISHED
            r.finish_s = b.end_s
            kv_depart(s.kv, r)
            if s.off != NULL:
                # The connector keeps the request's keys until the next schedule() signals its
                # finish (request_finished, then build_connector_meta).
                r.off_nblocks = _off_table_len(s.kv, 0, r)
                r.off_inflight = 0
                r.off_hold = 1
                off_fence_finished(s, ri)
                _off_unreserve_parked(s, r)
                if not r.held:
                    kv_free(s.kv, r)
            elif not r.held:
                kv_free(s.kv, r)
                kv_release_slot(s.kv, r)
            s.finished[s.n_finished] = ri
            s.n_finished += 1
            if was_running:
                n_stopped_running += 1
            else:
                _wq_remove(s, ri)
    if n_stopped_running > 0:
        j = 0
        for i in range(s.n_running):
            if s.reqs[s.running[i]].status != ST_FINISHED:
                s.running[j] = s.running[i]
                j += 1
        s.n_running = j
    if s.n_finished > 0:
        s.finished_pending = True
    if s.off != NULL:
        # _update_from_kv_xfer_finished: what the worker reported in this step's output.
        off_worker_output(s, b.step, b.start_s, b.end_s)
    if spec and not c.async_scheduling and b.total_tokens > 0:
        # update_draft_token_ids: k drafts for every unfinished request of the
        # batch; a prefill chunk's are dropped.
        for i in range(b.n):
            r = &s.reqs[b.req[i]]
            if r.status == ST_FINISHED:
                continue
            if r.is_prefill_chunk:
                r.num_spec = 0
            else:
                r.num_spec = c.num_spec_tokens
                s.draft_feeds += 1
    return 0
