# The discrete-event engine loop (vllm/v1/engine/core.py EngineCore.step and
# step_with_batch_queue) around the scheduler, with the step-time model and
# the result columns.  cimported by nothing; the Python side calls Engine.run.
from aisim._core.kvcache cimport KVCacheC
from aisim._core.request cimport ReqC
from aisim._core.scheduler cimport BatchC, SchedC
from aisim._core.steptime cimport TimeModelC
from aisim._core.types cimport block_id_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t

cdef enum LineKind:
    LINE_STEP = 0              # an iteration that called schedule()
    LINE_DRAIN = 1             # async: an iteration that only processed an output

cdef enum EventKind:
    EV_ARRIVED = 0
    EV_SCHED = 1
    EV_NEW = 2
    EV_RESUMED = 3
    EV_PREEMPTED = 4
    EV_FINISHED = 5

cdef struct StepColsC:
    # One row per logged engine iteration; grown geometrically.
    int64_t n
    int64_t cap
    step_t* step               # engine iteration index
    int32_t* kind              # LineKind
    step_t* updated_step       # async: the step whose output was processed (-1: none)
    sec_t* clock               # clock at schedule()
    sec_t* duration            # step time of the scheduled batch
    int32_t* num_reqs          # scheduled requests
    tok_t* prefill_tokens      # scheduled tokens that are not single-token decodes
    tok_t* decode_tokens
    int32_t* num_new
    int32_t* num_resumed
    int32_t* num_preempted
    int32_t* num_finished
    int32_t* running           # len(running) after the iteration
    int32_t* waiting           # len(waiting) after the iteration
    block_id_t* free_sched     # free blocks after schedule()
    block_id_t* free_blocks    # free blocks after the iteration (vLLM counts evictable cached ones)
    block_id_t* cached_blocks  # of those, blocks still holding a prefix (resident, unreferenced)
    int64_t* queries           # prefix-cache queries of first admissions
    int64_t* hits
    int64_t* p_queries         # ... of re-admissions after preemption
    int64_t* p_hits

cdef struct EventsC:
    # Decision-log events: (line, kind, request, value), grown geometrically.
    int64_t n
    int64_t cap
    int64_t* line
    int32_t* kind
    req_t* req
    tok_t* value


cdef class Engine:
    cdef ReqC* reqs
    cdef req_t n_reqs
    cdef KVCacheC kv
    cdef SchedC sched
    cdef BatchC batches[2]
    cdef TimeModelC time_model
    cdef bint timed                # arrivals by clock (else by engine step)
    cdef bint record_events
    cdef bint ready
    cdef StepColsC cols
    cdef EventsC events
    cdef object _keep              # arrays the C side points into
    cdef object _tm_keep           # step-time model arrays the C side points into
    cdef const step_t* arrival_step
    cdef const sec_t* arrival_time
    cdef req_t* open_idx           # requests that arrive on their own, in trace order
    cdef req_t n_open
    cdef req_t _nxt                # next open-loop request to arrive
    cdef sec_t* rel_time           # closed-loop releases: a binary heap on (time, request)
    cdef req_t* rel_req
    cdef req_t n_rel
    cdef int _log_line(self, step_t step, int32_t kind, sec_t clock, const BatchC* sched_b,
                       const BatchC* upd_b, block_id_t free_sched) except -1 nogil
    cdef int _range_error(self, step_t step) except -1 nogil
    cdef void _rel_push(self, sec_t t, req_t r) noexcept nogil
    cdef void _rel_pop(self) noexcept nogil
    cdef void _release_next_turns(self) noexcept nogil
    cdef bint _open_due(self, sec_t clock, step_t step) noexcept nogil
    cdef int _run(self) except -1 nogil
