# The discrete-event engine loop (vllm/v1/engine/core.py EngineCore.step and
# step_with_batch_queue) around the scheduler, with the step-time model and
# the result columns.  cimported by nothing; the Python side calls Engine.run.
from aisim._core.heap cimport HeapC
from aisim._core.kvcache cimport KVCacheC
from aisim._core.request cimport ReqC
from aisim._core.scheduler cimport BatchC, SchedC, SchedConfC
from aisim._core.steptime cimport TimeModelC
from aisim._core.types cimport block_id_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t

cdef enum LineKind:
    LINE_STEP = 0              # an iteration that called schedule()
    LINE_DRAIN = 1             # async: an iteration that only processed an output

# Decision-log events (aisim/decisionlog.py reads them through aisim._core.constants).
cdef enum EventKind:
    EV_ARRIVED = 0             # the engine added the request
    EV_SCHED = 1               # scheduled, value = tokens
    EV_NEW = 2                 # first admission, value = num_computed_tokens
    EV_RESUMED = 3             # re-admission after preemption, value = num_computed_tokens
    EV_PREEMPTED = 4           # preempted
    EV_FINISHED = 5            # finished by the processed output
    EV_SPEC = 6                # drafts verified with the scheduled tokens (or padding), value = drafts
    EV_SPEC_ACCEPTED = 7       # follows EV_SPEC: value = drafts accepted
    EV_SPEC_PADDED = 8         # follows EV_SPEC: the drafts are vLLM's -1 padding of an admission

# Step columns: one row per logged engine iteration.  The names and dtypes are
# engine.pyx STEP_COLUMNS, in this order (a test checks the two agree).
cdef enum StepCol:
    SC_STEP                    # engine iteration index
    SC_KIND                    # LineKind
    SC_UPDATED_STEP            # async: the step whose output was processed (-1: none)
    SC_CLOCK                   # clock at schedule()
    SC_DURATION                # step time of the scheduled batch
    SC_NUM_REQS                # scheduled requests
    SC_PREFILL                 # scheduled tokens that are not single-token decodes
    SC_DECODE                  # scheduled single-token decodes
    SC_NUM_NEW                 # first admissions
    SC_NUM_RESUMED             # re-admissions after preemption
    SC_NUM_PREEMPTED           # preemptions
    SC_NUM_FINISHED            # requests finished by the processed output
    SC_RUNNING                 # len(running) after the iteration
    SC_WAITING                 # len(waiting) after the iteration
    SC_FREE_SCHED              # free blocks after schedule()
    SC_FREE_BLOCKS             # free blocks after the iteration (vLLM counts evictable cached ones)
    SC_CACHED_BLOCKS           # of those, blocks still holding a prefix (resident, unreferenced)
    SC_QUERIES                 # prefix-cache queries of first admissions
    SC_HITS                    # ... and their hits
    SC_P_QUERIES               # prefix-cache queries of re-admissions after preemption
    SC_P_HITS                  # ... and their hits
    SC_SPEC_TOKENS             # draft tokens scheduled for verification (-1 padding included)
    SC_SPEC_ACCEPTED           # ... of those, accepted
    N_STEP_COLS                # number of step columns

# Request columns, read from ReqC after the run; engine.pyx REQUEST_COLUMNS.
cdef enum ReqCol:
    RC_STATUS                  # ReqStatus
    RC_OUTPUT                  # output tokens produced
    RC_CACHED                  # local prefix hit at the first admission
    RC_CACHED_ALL              # local prefix hits summed over every admission
    RC_PREEMPTIONS             # times preempted
    RC_ARRIVAL                 # clock when the engine added the request
    RC_FIRST_SCHED             # clock of the first step that scheduled it (-1: never)
    RC_FIRST_TOKEN             # end of the step that produced its first output (-1: none)
    RC_FINISH                  # end of the step that produced its last output (-1: unfinished)
    RC_SPEC_DRAFTS             # draft tokens scheduled for verification
    RC_SPEC_ACCEPTED           # ... of those, accepted
    N_REQ_COLS                 # number of request columns

cdef struct StepColsC:
    # One row per logged engine iteration; every column grown geometrically.
    int64_t n                  # rows written
    int64_t cap                # rows allocated
    void* col[N_STEP_COLS]     # column k: cap items of its dtype (StepCol order)

cdef struct EventsC:
    # Decision-log events: (line, kind, request, value), grown geometrically.
    int64_t n                  # events written
    int64_t cap                # events allocated
    int64_t* line              # [cap] step row the event belongs to
    int32_t* kind              # [cap] EventKind
    req_t* req                 # [cap] the request
    tok_t* value               # [cap] tokens (scheduled, or computed at admission); else 0


cdef class Engine:
    cdef ReqC* reqs                # [n_reqs] the requests, trace order
    cdef req_t n_reqs              # requests of the replay
    cdef KVCacheC kv               # the KV-cache manager (one block pool)
    cdef SchedC sched              # the scheduler over reqs and kv
    cdef BatchC batches[2]         # the batch queue (one slot used when synchronous)
    cdef TimeModelC time_model     # prices every scheduled batch
    cdef bint timed                # arrivals by clock (else by engine step)
    cdef bint record_events        # keep the decision-log events
    cdef bint ready                # not run yet (run is allowed once)
    cdef StepColsC cols            # the step columns
    cdef EventsC events            # the decision-log events
    cdef object _keep              # arrays the C side points into
    cdef object _tm_keep           # step-time model arrays the C side points into
    cdef object _spec_keep         # acceptance arrays the C side points into
    cdef const step_t* arrival_step  # [n_reqs] arrival by engine iteration (step-clocked traces)
    cdef const sec_t* arrival_time   # [n_reqs] arrival in seconds (time-clocked traces)
    cdef req_t* open_idx           # requests that arrive on their own, in trace order
    cdef req_t n_open              # their number
    cdef req_t _nxt                # next open-loop request to arrive
    cdef HeapC rel                 # closed-loop releases, by (0, time, request index)
    cdef int _set_speculative(self, dict spec, object trace, SchedConfC* conf) except -1
    cdef int _log_line(self, step_t step, int32_t kind, sec_t clock, const BatchC* sched_b,
                       const BatchC* upd_b, block_id_t free_sched) except -1 nogil
    cdef int _range_error(self, step_t step) except -1 nogil
    cdef void _release_next_turns(self) noexcept nogil
    cdef bint _open_due(self, sec_t clock, step_t step) noexcept nogil
    cdef int _run(self) except -1 nogil
