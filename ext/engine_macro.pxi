# Included into engine.pyx: macro-steps.  Between events that can change a decision, every
# iteration of an engine schedules the same running requests with one decode token
# each.  Such a quiet stretch is replayed in one move: the requests' counters are advanced once
# per stretch, and the KV cache is called, in step-major and running order, only at the steps
# where a decode can touch it (kv_decode_period: a block to take, fill or release); every other
# call of kv_allocate_slots would be a no-op.  The step times are still summed one step at a
# time and every step row and decision-log event is written, so the output is byte-identical to
# stepping one iteration at a time (Engine(macro_steps=False)).  The step that ends a stretch (a
# request finishes, or the waiting pass admits one) has its running pass done the same way and
# the rest of the step done as any step's.  Free functions over the Engine's C fields;
# engine.pyx is their one user.
#
# An asynchronous engine (a batch queue of two) is quiet the same way, one batch behind: each
# iteration schedules every running request's next token while the previous batch's tokens are
# in flight (one placeholder each) and processes that batch's output; its stretch ends before
# the step at which a request's last token is in flight (the scheduler's async guard skips it).
#
# With a KV offload tier the connector runs every step of a stretch for real, save for what a
# quiet step provably leaves alone: its waiting pass (lookups, loads, the requests parked for
# them, the disk tier's poll), build_connector_meta (fenced flushes, the stores of requests
# finished by the last update, on_schedule_end) and the worker's output (landings, by step count
# or clock) all run as in any step.  Skipped: the store check of each running request, since the
# stretch ends before any of them could get a store job (offload.pxi off_quiet_bound), and the
# stamping of blocks handed out, done for the decodes that take one (off_stamp_one).

# A stretch of one step (the step in which a request finishes) is taken from this many running
# requests on: its running pass then costs less than a single step's, set-up included.
cdef int32_t MIN_ONE_STEP = 8

# Longest period of block work a stretch follows (kv_decode_period's cap).
cdef tok_t MAX_PERIOD = 1 << 15

# No bound on when a stretch's iterations start (a single engine's stretch).
cdef sec_t INF_TIME = 1e300


cdef int _macro_init(Engine e) except -1 nogil:
    """Macro-steps for an engine without drafts, over KV-cache groups whose decodes touch the
    cache at known residues; else off (period 0).  Mamba's block-aligned split
    (Scheduler._mamba_block_aligned_split) leaves a decode's one token alone."""
    cdef MacroC* m = &e.macro
    cdef SchedConfC* c = &e.sched.conf
    memset(m, 0, sizeof(MacroC))
    if c.num_spec_tokens > 0 or c.aware_window > 0:
        # Drafts, and cache-aware admission (the waiting queue is reordered in every step).
        return 0
    m.works = <flag_t*>mem_calloc(MAX_PERIOD, sizeof(flag_t))
    m.period = kv_decode_period(&e.kv, m.works, MAX_PERIOD)
    if m.period > 0 and (m.period & (m.period - 1)) == 0:
        m.mask = m.period - 1
    if m.period > 0:
        m.cap = e.sched.cap
        m.c0 = <tok_t*>mem_calloc(m.cap, sizeof(tok_t))
        m.o0 = <tok_t*>mem_calloc(m.cap, sizeof(tok_t))
        m.phase = <int32_t*>mem_calloc(m.cap, sizeof(int32_t))
        m.at = <int32_t*>mem_calloc(m.cap, sizeof(int32_t))
    return 0


cdef int _macro_grow(MacroC* m, int32_t cap) except -1 nogil:
    """Room for ``cap`` running requests (the batch capacity grew with the engine's slots)."""
    if m.period > 0 and cap > m.cap:
        mem_grow(<void**>&m.c0, m.cap, cap, sizeof(tok_t))
        mem_grow(<void**>&m.o0, m.cap, cap, sizeof(tok_t))
        mem_grow(<void**>&m.phase, m.cap, cap, sizeof(int32_t))
        mem_grow(<void**>&m.at, m.cap, cap, sizeof(int32_t))
        m.cap = cap
    return 0


cdef void _macro_release(MacroC* m) noexcept nogil:
    mem_free(m.works)
    mem_free(m.c0)
    mem_free(m.o0)
    mem_free(m.phase)
    mem_free(m.at)
    memset(m, 0, sizeof(MacroC))


cdef int64_t _quiet_length(Engine e) noexcept nogil:
    """Steps from here whose running pass schedules one decode token for every running request
    and changes nothing else; 0: step normally.  Synchronous, the last of them is the step in
    which the first request finishes (max_tokens or max_model_len: check_stop); asynchronous, the
    steps end before the one at which a request's last token is in flight.

    That holds when the last iteration scheduled every running request and left each decoding
    (synchronous: num_computed_tokens + 1 == num_tokens, nothing in flight; asynchronous: the
    batch in flight holds every running request with one decode token, each with one
    placeholder), no pending copy, sliding windows settled, and the running pass fits all of them
    in both budgets.  The waiting pass still runs every step, for real: a stretch also ends with
    the step that admits.
    """
    cdef SchedC* s = &e.sched
    cdef const SchedConfC* c = &s.conf
    cdef BatchC* b
    cdef bint asy = c.async_scheduling
    cdef int32_t n = s.n_running, i
    cdef int64_t length = <int64_t>1 << 62, f
    cdef const ReqC* r
    if n == 0 or n > e.macro.cap:
        return 0
    if asy:
        b = &e.batches[e.q_head]  # the batch in flight
        if e.q_len != 1 or b.n != n or b.total_tokens != n or b.decode_tokens != n or b.n_preempted != 0:
            return 0
    else:
        b = &e.batches[0]
        if e.upd_batch != b or b.n != n + s.n_finished:
            return 0
    if n > c.max_num_scheduled_tokens or n > c.max_num_batched_tokens:
        return 0
    for i in range(n):
        r = &s.reqs[s.running[i]]
        if asy:
            if (r.num_computed != num_tokens(r) or r.num_placeholders != 1 or r.num_in_flight != 1
                    or r.num_output < 1 or r.num_stale != 0 or not kv_decode_settled(&e.kv, r)):
                return 0
        elif (r.num_computed + 1 != num_tokens(r) or r.num_output < 1 or r.num_in_flight != 0
                or r.num_stale != 0 or not kv_decode_settled(&e.kv, r)):
            return 0
        f = r.max_tokens - r.num_output
        if c.max_model_len - num_tokens(r) < f:
            f = c.max_model_len - num_tokens(r)
        if asy:
            f -= 1
        if e.offload:
            # Decoding, out of Scheduler._inflight_prefills; the stretch ends before a step whose
            # build_connector_meta could give it a store job (offload.pxi off_quiet_bound).
            if r.off_inflight:
                return 0
            f = tmin(f, off_quiet_bound(s, r))
        if f < length:
            length = f
            if length < 1 or (length == 1 and n < MIN_ONE_STEP):
                return 0
    return length


cdef inline int32_t _residue(const MacroC* m, int64_t x) noexcept nogil:
    # x modulo the period (x >= 0): a mask when the period is a power of two, as it is for
    # block sizes that are (a division costs tens of cycles, once a request a stretch).
    if m.mask != 0:
        return <int32_t>(x & m.mask)
    return <int32_t>(x % m.period)


cdef inline void _at_step(const MacroC* m, ReqC* r, int32_t i, int64_t k) noexcept nogil:
    # Running request i as it stands when step k of the stretch is scheduled (k decodes done).
    r.num_computed = m.c0[i] + k
    r.num_output = m.o0[i] + k


cdef void _fill_decodes(const SchedC* s, BatchC* b, int32_t n) noexcept nogil:
    # The running pass of a quiet step: each running request, in running order, one decode token.
    cdef int32_t i
    for i in range(n):
        b.req[i] = s.running[i]
        b.tokens[i] = 1
        b.sampled[i] = 1
        b.decode[i] = 1


cdef int _stretch_outputs(Engine e, sec_t end_s, sec_t prev_s, int64_t k, int32_t n) except -1 nogil:
    """Step ``k`` of a stretch streams one output of each of its ``n`` running requests at
    ``end_s`` (sched_update's record of gaps, scheduler.pyx _update): at the first step each
    request's gap is its own; after it, every request's previous output ended step ``k - 1``
    (``prev_s``), so the step adds ``n`` gaps of one length.  The requests' ``last_token_s``
    catch up when the stretch ends."""
    cdef int32_t i
    cdef const ReqC* r
    if k > 0:
        return gaps_add(&e.gaps, end_s - prev_s, n)
    for i in range(n):
        r = &e.sched.reqs[e.sched.running[i]]
        gaps_add(&e.gaps, end_s - r.last_token_s, 1)
    return 0


cdef int64_t _stretch(Engine e, sec_t until) except -1 nogil:
    """Replay a quiet stretch from here, every iteration starting before ``until``; returns the
    steps it covered (0: step normally).  A replica's arrivals come from its deployment, between
    stretches (the deployment bounds a stretch by its next event); a single engine adds its own."""
    cdef MacroC* m = &e.macro
    cdef SchedC* s = &e.sched
    cdef bint asy = s.conf.async_scheduling
    cdef BatchC* b
    cdef BatchC* ob
    cdef tok_t P = m.period, lpt
    cdef int32_t n = s.n_running, i, j, x, kp, hi
    cdef int64_t k = 0, length
    cdef bint closed = False
    cdef ReqC* r
    cdef sec_t out_s = 0       # end of the last step whose outputs the stretch streamed
    length = _quiet_length(e)
    if length == 0:
        return 0
    # Each request's num_computed_tokens modulo P: at step k its decode may touch the KV cache
    # iff works[(phase + k) mod P].
    for i in range(n):
        r = &s.reqs[s.running[i]]
        m.c0[i] = r.num_computed
        m.o0[i] = r.num_output
        m.phase[i] = _residue(m, r.num_computed)
    if asy:
        _fill_decodes(s, &e.batches[(e.q_head + 1) % 2], n)  # the other slot; the one in flight later
    else:
        _fill_decodes(s, &e.batches[0], n)
    while k < length:
        if k > 0:
            if e.cols.n >= e.out_rows or e.clock >= until:
                break  # Engine.advance hands the rows over here, as between single steps
            if not e.replica and _add_arrivals(e) == ADV_INPUT:
                break
        # The requests whose decode may touch the KV cache in this step, in running order.
        kp = _residue(m, k) if k >= P else <int32_t>k
        hi = 0
        for i in range(n):
            x = m.phase[i] + kp
            if m.works[x - P if x >= P else x]:
                m.at[hi] = i
                hi += 1
        # Each call takes at most one block per group: with that many free, none can preempt.
        if <int64_t>hi * e.kv.n_groups > e.kv.pool.num_free:
            break
        # The batch this step schedules (asynchronous: the queue's free slot).
        b = &e.batches[(e.q_head + e.q_len) % 2] if asy else &e.batches[0]
        if asy and k == 1:
            _fill_decodes(s, b, n)  # the slot of the batch that was in flight when the stretch began
        # Scheduler.schedule: the step's threshold from the requests eligible now, then the
        # running pass (allocate_slots for each one new token: only the calls that do anything).
        lpt = sched_step_lpt(s)
        e.last_start = e.clock
        kv_new_step_starts(&e.kv)
        b.step = e.step
        b.start_s = e.clock
        b.n = n
        b.total_tokens = n
        b.decode_tokens = n
        b.n_new = b.n_resumed = b.n_preempted = 0
        b.queries = b.hits = b.requests = 0
        b.p_queries = b.p_hits = b.p_requests = 0
        for j in range(hi):
            i = m.at[j]
            r = &s.reqs[s.running[i]]
            _at_step(m, r, i, k)
            kv_allocate_slots(&e.kv, r, 1, 0, False, True, 0, False)
            if e.offload:
                off_stamp_one(s, r, b.step)  # the blocks the scheduler output hands out
        if s.n_waiting > 0 or (e.offload and e.off.n_parked > 0):
            # The waiting pass, for real; the running requests' counters are not read there
            # (with a tier, _off_reserved_blocks reads only in-flight prefills').  With a tier and
            # nothing waiting or parked it would only poll the disk tier: off_quiet_meta does.
            sched_admit_waiting(s, b, lpt)
        if b.n > n or (k == length - 1 and not asy):
            # It admitted, or (synchronous) a request finishes: this step ends as any other (its
            # output processed by update_from_output), and the stretch with it.
            for i in range(n):
                _at_step(m, &s.reqs[s.running[i]], i, k)
                if k > 0:
                    s.reqs[s.running[i]].last_token_s = out_s
            sched_end_schedule(s, b)
            e._price(b)
            if asy:
                e.q_len += 1
                e._end_async_step(b, e.kv.pool.num_free)
            else:
                e._end_sync_step(b)
            k += 1
            closed = True
            break
        kv_end_schedule(&e.kv)
        if e.offload:
            off_quiet_meta(s, b)  # build_connector_meta: no store of a running request is due
        if e.time_model.kind != TM_LINEAR:
            for i in range(n):
                b.ctx[i] = m.c0[i] + k + 1
        e._price(b)
        b.free_after_schedule = e.kv.pool.num_free
        # update_from_output: one token each (asynchronous: of the batch before), nobody finishes.
        s.n_finished = 0
        s.finished_pending = False
        if asy:
            ob = &e.batches[e.q_head]
            e.q_head = (e.q_head + 1) % 2
            e.upd_batch = ob
        else:
            ob = b
        _stretch_outputs(e, ob.end_s, out_s, k, n)
        if e.offload:
            # _update_from_kv_xfer_finished: the worker's output of ob, for real (a landing may
            # unpark a request, admitted by the next step's waiting pass, which ends the stretch).
            off_worker_output(s, ob.step, ob.start_s, ob.end_s)
        out_s = ob.end_s
        _log_line(e, e.step, LINE_STEP, e.clock, b, ob, e.kv.pool.num_free)
        e.clock = b.end_s
        e.step += 1
        k += 1
    if not closed:
        # Every request has advanced k decode steps (update_from_output: one sampled token each);
        # asynchronous, one more is still in flight (its placeholder), as before the stretch.
        for i in range(n):
            _at_step(m, &s.reqs[s.running[i]], i, k)
            if k > 0:
                s.reqs[s.running[i]].last_token_s = out_s
    if k > 0:
        e.stalled = 0
        m.stretches += 1
        m.steps += k
    return k
