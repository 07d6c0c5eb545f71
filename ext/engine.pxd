# The discrete-event engine loop (vllm/v1/engine/core.py EngineCore.step and
# step_with_batch_queue) around the scheduler, with the step-time model and
# the result columns.  cimported by nothing; the Python side feeds it
# arrivals (Engine.feed), runs it (Engine.advance, Engine.run) and takes its
# result rows (Engine.take_steps, Engine.take_requests).
from aisim._core.heap cimport HeapC
from aisim._core.kvcache cimport KVCacheC
from aisim._core.offload cimport OffloadC
from aisim._core.request cimport ReqC
from aisim._core.scheduler cimport BatchC, SchedC, SchedConfC
from aisim._core.steptime cimport TimeModelC
from aisim._core.types cimport GapsC, block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t

# What Engine.advance stopped for.
cdef enum Advance:
    ADV_DONE = 0               # every request finished (or none is left to arrive)
    ADV_INPUT = 1              # the next arrival is not fed yet: feed more, or end the input
    ADV_OUTPUT = 2             # result rows have piled up: take them

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
    # KV offload (the step's `offload` object of the decision log); value as said
    EV_OFF_LOOKUP = 9          # a connector lookup, value = the local hit it was given
    EV_OFF_LOOKUP_EXT = 10     # follows EV_OFF_LOOKUP: tokens offered (-1: None)
    EV_OFF_LOAD = 11           # a load job, value = its id
    EV_OFF_LOAD_TOKENS = 12    # follows EV_OFF_LOAD: num_external_tokens
    EV_OFF_LOAD_CHUNKS = 13    # follows EV_OFF_LOAD: chunks read
    EV_OFF_STORE = 14          # a store job, value = its id
    EV_OFF_STORE_CHUNKS = 15   # follows EV_OFF_STORE: chunks written
    EV_OFF_FLUSH = 16          # a job flushed, value = its id
    EV_OFF_WAIT = 17           # in WAITING_FOR_REMOTE_KVS after schedule()
    EV_OFF_DONE = 18           # a job the worker reported, value = its id
    EV_OFF_RECV = 19           # finished_recving

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

# Request columns, read from ReqC when a request retires; engine.pyx REQUEST_COLUMNS.
cdef enum ReqCol:
    RC_STATUS                  # ReqStatus
    RC_OUTPUT                  # output tokens produced
    RC_CACHED                  # local prefix hit at the first admission
    RC_CACHED_ALL              # local prefix hits summed over every admission
    RC_PREEMPTIONS             # times preempted
    RC_ARRIVAL                 # when the client sent it (ReqC.sent_s)
    RC_PICKED_UP               # clock when the engine added it (ReqC.picked_up_s)
    RC_FIRST_SCHED             # clock of the first step that scheduled it (-1: never)
    RC_FIRST_TOKEN             # end of the step that produced its first output (-1: none)
    RC_FINISH                  # end of the step that produced its last output (-1: unfinished)
    RC_SPEC_DRAFTS             # draft tokens scheduled for verification
    RC_SPEC_ACCEPTED           # ... of those, accepted
    N_REQ_COLS                 # number of request columns

# KV offload columns of a step (engine_rows.pxi OFF_STEP_COLUMNS) and of a request (OFF_REQ_COLUMNS),
# kept only with KV offload: int64 rows of N_OFF_STEP (N_OFF_REQ) values.
cdef enum:
    N_OFF_STEP = 17
    N_OFF_REQ = 4
    N_DISK_STEP = 7            # with the disk tier too (engine_disk.pxi DISK_STEP_COLUMNS, DISK_REQ_COLUMNS)
    N_DISK_REQ = 1
    N_OFF_COUNTS = 15          # the step columns counting this step's work; the last two are levels

cdef struct OffColsC:
    # The offload columns of the step rows (engine_offload.pxi OFF_STEP_COLUMNS), kept sparse: only
    # the rows that count some work or change a level of the tier, each as its step row's index
    # then its N_OFF_STEP values; every other row's counts are 0 and its levels those of the row
    # before (built into whole columns when the step rows are taken, _off_columns).
    int64_t n                  # rows kept
    int64_t cap                # rows allocated
    int64_t* rows              # [cap * (1 + N_OFF_STEP)]
    int64_t used               # the levels (cpu_used, cpu_evictable) of the last row kept ...
    int64_t evictable
    int64_t from_used          # ... and of the row before the first row not yet taken
    int64_t from_evictable

cdef enum:
    STEP_STAGE = 32            # step rows staged row-major before their columns take them

cdef struct StepColsC:
    # One row per logged engine iteration; every column grown geometrically.  The last rows
    # written wait in ``stage`` (a row's values side by side, a float64 by its bits) and go to
    # the columns STEP_STAGE at a time (_cols_flush): a tier's connector work between two steps
    # evicts the cache lines of the 23 columns, not those of one staged row.
    int64_t n                  # rows written
    int64_t cap                # rows allocated
    int64_t staged             # rows before it are in the columns, the rest in ``stage``
    void* col[N_STEP_COLS]     # column k: cap items of its dtype (StepCol order)
    int64_t stage[STEP_STAGE * N_STEP_COLS]

cdef struct ReqColsC:
    # One row per retired request, in trace order; every column grown geometrically.
    int64_t n                  # rows written
    int64_t cap                # rows allocated
    void* col[N_REQ_COLS]      # column k: cap items of its dtype (ReqCol order)

cdef struct ArenaC:
    # Variable-length data of the requests in slots, as parallel columns; a request holds
    # entries [off, off + cnt).  Packed afresh when full (engine_slots.pxi _make_room).
    int64_t n                  # entries used (some by retired requests until the next packing)
    int64_t cap                # entries allocated
    int32_t n_cols             # columns in use
    size_t item[3]             # bytes per entry of each column
    void* col[3]               # column k: cap entries

cdef struct EventsC:
    # Decision-log events: (line, kind, request, value), grown geometrically.
    int64_t n                  # events written
    int64_t cap                # events allocated
    int64_t* line              # [cap] step row the event belongs to
    int32_t* kind              # [cap] EventKind
    req_t* req                 # [cap] the request
    tok_t* value               # [cap] tokens (scheduled, or computed at admission); else 0


cdef struct MacroC:
    # Macro-steps (engine_macro.pxi): a quiet stretch of decoding replayed in one move.
    tok_t period               # P of kv_decode_period: residues of num_computed_tokens modulo P (0: off)
    tok_t mask                 # P - 1 when P is a power of two (a residue is then a mask), else 0
    flag_t* works              # [MAX_PERIOD] works[x]: a decode at num_computed_tokens = x (mod P) may touch the cache
    int32_t cap                # running requests a stretch can hold (the batch capacity)
    tok_t* c0                  # [cap] each running request's num_computed_tokens when the stretch began
    tok_t* o0                  # [cap] ... and its output tokens
    int32_t* phase             # [cap] ... and num_computed_tokens modulo period
    int32_t* at                # [cap] scratch: the running-list positions whose decode touches the cache this step
    int64_t stretches          # stretches replayed
    int64_t steps              # engine steps they covered


cdef struct TraceC:
    # A deployment's trace as borrowed C arrays (aisim.core_input.CoreTrace, time-clocked);
    # replica_add copies one request out of it.  acc_* are NULL without accept lists.
    int64_t n
    const tok_t* prompt_len
    const tok_t* max_tokens
    const int32_t* priority
    const sec_t* arrival_key
    const int32_t* id_rank
    const int32_t* seg_off
    const int32_t* seg_cnt
    const hash_t* out_stream
    const hash_t* seg_stream
    const tok_t* seg_first
    const tok_t* seg_len
    const sec_t* arrival_time
    # The API server's seconds for each request before the engine sees it (NULL: engine only).
    const sec_t* frontend_s
    const int32_t* acc_off
    const int32_t* acc_cnt
    const int64_t* acc_values
    # Closed loop (NULL: open loop): each request's next turn (-1: none), the think time before it is
    # sent (a next turn's own), and whether a finish sends it (1) rather than its timestamp (0).
    const int32_t* next_turn
    const sec_t* think_s
    const flag_t* follows
    # Requests sharing no block with any other (CoreTrace.private; NULL: none): keyed lazily.
    const flag_t* private_req


cdef class Engine:
    # Requests live in slots from the moment they are fed until they are retired: their row
    # written out, in trace order, once they and every request before them have finished.  The
    # scheduler sees slot numbers as its request indices; its per-request arrays are sized to the
    # slots and grow with them (engine_slots.pxi), so memory follows the requests in flight, not the trace.
    cdef ReqC* reqs                # [pool_cap] the request slots
    cdef req_t pool_cap            # slots allocated
    cdef req_t* free_slots         # [pool_cap] stack of unused slots (the top is used next)
    cdef req_t n_free              # its depth
    cdef int64_t* slot_global      # [pool_cap] trace index of each slot's request
    cdef sec_t* slot_time          # [pool_cap] its arrival in seconds (time-clocked traces); once sent
                                   # through the API server, when the engine sees it
    cdef sec_t* slot_front         # [pool_cap] the API server's seconds for it (aisim/perf/frontend.py)
    cdef step_t* slot_step         # [pool_cap] its arrival by engine iteration (step-clocked traces)
    cdef int64_t* slot_next        # [pool_cap] closed loop: trace index of its next turn (-1: none)
    cdef flag_t* slot_pin          # [pool_cap] scratch: in a batch still in flight (not retired yet)
    cdef sec_t* slot_next_think    # [pool_cap] closed loop: that turn's think time
    cdef req_t* win                # [win_cap] slot of trace index g, for retired <= g < loaded
    cdef int64_t win_cap           # a power of two
    cdef int64_t retired           # requests retired: their rows are written
    cdef int64_t loaded            # requests fed
    cdef req_t* open_q             # [open_cap] ring: fed open-loop requests yet to arrive (trace order)
    cdef int64_t open_cap          # a power of two
    cdef int64_t open_head         # its first entry
    cdef int64_t open_n            # its entries
    cdef ArenaC segs               # prompt segments of the requests in slots: stream, first token, length
    cdef ArenaC accs               # speculative decoding: their trace `accept` lists
    cdef KVCacheC kv               # the KV-cache manager (one block pool)
    cdef SchedC sched              # the scheduler over reqs and kv
    cdef BatchC batches[2]         # the batch queue (one slot used when synchronous)
    cdef TimeModelC time_model     # prices every scheduled batch
    cdef bint timed                # arrivals by clock (else by engine step)
    cdef bint record_events        # keep the decision-log events
    cdef bint ended                # the input is complete
    cdef bint finished             # the replay has ended
    cdef bint whole                # built from a whole trace: run() returns every row at once
    cdef int64_t out_rows          # advance() stops when this many result rows are waiting
    cdef StepColsC cols            # the step columns (rows not yet taken)
    cdef int64_t steps_taken       # step rows taken so far
    cdef ReqColsC rcols            # the request columns of retired requests (rows not yet taken)
    cdef EventsC events            # the decision-log events
    cdef GapsC gaps                # gaps between each request's outputs (pairs not yet taken)
    cdef object _tm_keep           # step-time model arrays the C side points into
    cdef object _spec_keep         # acceptance arrays the C side points into
    cdef object _node_keep         # the runs' nodes KVCacheC.run_node points into
    cdef HeapC rel                 # closed-loop releases, by (0, time, trace index)
    cdef int64_t max_conc          # the client's cap on requests in flight (0: none)
    cdef int64_t in_flight         # requests sent and not finished
    cdef sec_t cap_free_s          # when a finish last released the client's cap while it was full
    cdef int64_t cap_pending       # finishes the last iteration reported, not yet taken off in_flight
    cdef bint front                # requests pass the API server's serial queue before the engine
    cdef sec_t front_free          # when that server is next free
    cdef req_t* srv_q              # [srv_cap] ring: requests sent, in the server's queue (send order)
    cdef int64_t srv_cap           # a power of two
    cdef int64_t srv_head          # its first entry
    cdef int64_t srv_n             # its entries
    # the loop's own state, kept between advance() calls
    cdef step_t step               # the next engine iteration
    cdef sec_t clock               # simulated time
    cdef int32_t q_len             # async: batches in flight
    cdef int32_t q_head            # async: the oldest of them
    cdef int64_t stalled           # iterations in a row without progress
    cdef BatchC* upd_batch         # the batch whose output the last iteration processed (NULL: none)
    cdef MacroC macro              # macro-steps: quiet stretches of decoding in one move
    cdef bint replica              # a deployment's replica (fed and stepped by aisim._core.deploy)
    cdef sec_t last_start          # clock at the start of the last iteration
    cdef sec_t poll_floor          # the last row polled for a copy on the clock past its forward pass's
                                   # end, which this is (-1: not); a replica's next arrival cuts it
    # KV offload behind the GPU cache (ext/offload.pxi): the CPU tier and its rows
    cdef bint offload              # on
    cdef OffloadC off              # the connector's state (sched.off points here)
    cdef OffColsC off_cols         # the step rows' offload columns
    cdef int64_t* off_reqs         # [off_reqs_cap * N_OFF_REQ] the request rows' offload columns
    cdef int64_t off_reqs_cap
    cdef int64_t* disk_steps       # [disk_steps_cap * N_DISK_STEP] the step rows' disk-tier columns
    cdef int64_t disk_steps_cap
    cdef int64_t* disk_reqs        # [disk_reqs_cap * N_DISK_REQ] the request rows' disk-tier columns
    cdef int64_t disk_reqs_cap
    cdef int _range_error(self, step_t step) except -1 nogil
    cdef int _schedule_batch(self, BatchC* b) except -1 nogil
    cdef int _price(self, BatchC* b) except -1 nogil
    cdef int _end_sync_step(self, BatchC* b) except -1 nogil
    cdef BatchC* _process_oldest(self) except NULL nogil
    cdef int _end_async_step(self, BatchC* b, block_id_t free_sched) except -1 nogil
    cdef int _add_request(self, req_t r) except -1 nogil
    cdef int _retire(self, bint all_of_them) except -1 nogil
    cdef int _run(self) except -1 nogil
    cdef int _iterate(self) except -1 nogil
    cdef int _set_speculative(self, dict spec, SchedConfC* conf) except -1
    cdef int _set_offload(self, dict off, tok_t hash_block, tok_t max_model_len) except -1


# A deployment's replica (engine_replica.pxi): deploy.pyx feeds it one request at a time, steps it
# one iteration at a time at its clock, and ends it.
cdef req_t replica_add(Engine e, const TraceC* t, int64_t i, sec_t at, bint front) except -1 nogil
cdef int replica_step(Engine e, sec_t until) except -1 nogil
cdef int replica_wake(Engine e, sec_t at) except -1 nogil
cdef int replica_end(Engine e) except -1 nogil
