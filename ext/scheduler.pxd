# vLLM's v1 Scheduler / AsyncScheduler for the default path: schedule() and
# update_from_output() over C arrays.  cimported by engine, which owns the
# request array and drives the loop.  Mirrors vllm/v1/core/sched/scheduler.py,
# async_scheduler.py and request_queue.py, drafts included; a release's rules are ``conf.rules``.
from aisim._core.heap cimport HeapC
from aisim._core.kvcache cimport KVCacheC
from aisim._core.offload cimport DiskConfC, OffConfC, OffloadC
from aisim._core.request cimport ReqC
from aisim._core.types cimport GapsC, RulesC, block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t

# How the fake model decides how many drafts it accepts (aisim.config.speculative).
cdef enum AcceptKind:
    ACC_PERMILLE = 0     # the seeded hash rule: per-position acceptance in permille
    ACC_COUNTS = 1       # a list of counts, cycled over a request's verifications
    ACC_HISTOGRAM = 2    # a seeded draw from P(exactly j accepted), as 53-bit thresholds

cdef struct SchedConfC:
    tok_t max_num_batched_tokens     # input_budget per step
    tok_t max_num_scheduled_tokens   # token_budget per step
    int32_t max_num_running_reqs     # max_num_seqs
    int32_t max_num_active_reqs      # max_num_active_seqs (default max_num_seqs)
    tok_t long_prefill_token_threshold  # cap of one prefill chunk (0 = none)
    bint adaptive_threshold          # long_prefill_token_threshold_adaptive
    bint chunked_prefill             # enable_chunked_prefill
    bint priority                    # policy == "priority"
    bint reserve_full_isl            # scheduler_reserve_full_isl
    bint async_scheduling            # AsyncScheduler (output placeholders)
    tok_t max_model_len              # longest sequence
    RulesC rules                     # the release's rule switches (aisim/config/versions.py)
    bint mamba_split                 # need_mamba_block_aligned_split (Mamba groups in align mode)
    tok_t cache_block_size           # cache_config.block_size (the Mamba block)
    bint mamba_output_caching        # sync engine, Mamba layers, prefix caching and the release's
                                     # mamba_sync_output_caches_final_blocks (update_from_output)
    int32_t aware_window             # cache_aware_admission_window as resolved (0: off; FCFS and caching)
    double aware_threshold           # cache_aware_admission_threshold (KV usage)
    bint mamba_partial               # mamba_partial_cache_hit (fine-grained hits)
    bint mamba_has_ckpt              # every Mamba group has prefill checkpoint blocks
    tok_t mamba_ckpt_align           # prefill_checkpoint_alignment of the first Mamba group (0 = None)
    # speculative decoding (vllm/config/speculative.py, VllmConfig.num_lookahead_tokens)
    tok_t num_spec_tokens            # drafts per step, k (0 = off)
    tok_t num_lookahead              # num_lookahead_tokens: KV slots reserved past the scheduled tokens
    tok_t draft_slots                # max_num_new_slots_for_drafting: input budget per scheduled request
    bint eagle_drop                  # use_eagle_block_drop (0.31/0.32 EAGLE/MTP)
    tok_t hash_lookahead             # num_hash_lookahead_tokens (0.33 EAGLE/MTP)
    int32_t acc_kind                 # AcceptKind
    int32_t acc_n                    # entries of acc_table
    const int64_t* acc_table         # [acc_n] permille per position, counts, or histogram thresholds
    hash_t acc_seed_mix              # sm(seed) of the hash and histogram rules
    const int64_t* acc_list          # every request's trace `accept` list, concatenated

cdef struct BatchC:
    # One SchedulerOutput, plus what the decision log and telemetry need.
    step_t step                      # engine iteration that scheduled it
    sec_t start_s                    # clock when it was scheduled
    sec_t end_s                      # clock when its forward pass ends (set by the engine)
    int32_t n                        # scheduled requests
    req_t* req                       # [cap] num_scheduled_tokens order: running pass, then admissions
    tok_t* tokens                    # [cap] scheduled tokens
    flag_t* sampled                  # [cap] the model samples one token (not a prefill chunk)
    flag_t* decode                   # [cap] the entry only processes the newest token
    tok_t* ctx                       # [cap] context after the step (num_computed_tokens)
    tok_t total_tokens               # sum of tokens[0 : n]
    tok_t decode_tokens              # of those, tokens of entries that only process the newest token
    int32_t n_new                    # first admissions: request -> num_computed_tokens
    req_t* new_req                   # [cap]
    tok_t* new_computed              # [cap]
    int32_t n_resumed                # re-admissions after preemption
    req_t* res_req                   # [cap]
    tok_t* res_computed              # [cap]
    int32_t n_preempted              # requests preempted in this step
    req_t* preempted                 # [cap]
    block_id_t free_after_schedule   # free blocks after schedule()
    int64_t queries                  # PrefixCacheStats of this step's first admissions
    int64_t hits
    int64_t requests
    int64_t p_queries                # ... and of its re-admissions
    int64_t p_hits
    int64_t p_requests
    # speculative decoding (last, so the hot fields keep their places)
    tok_t* spec_m                    # [cap] drafts verified with the entry (0: none; padding: k)
    tok_t* spec_a                    # [cap] of those, accepted (decided when the batch is formed)
    flag_t* padded                   # [cap] the drafts are vLLM's -1 padding of a one-token admission
    tok_t spec_tokens                # sum of spec_m (padding included)
    tok_t spec_accepted              # sum of spec_a

cdef struct SchedC:
    SchedConfC conf                  # the knobs, fixed for the replay
    KVCacheC* kv                     # the engine's KV-cache manager
    ReqC* reqs                       # [n_reqs] owned by the engine
    req_t n_reqs                     # requests of the replay
    req_t* running                   # [n_reqs] admission order (Scheduler.running)
    int32_t n_running
    req_t* waiting                   # [n_reqs + 1] FCFS ring deque (FCFS policy)
    HeapC wheap                      # the waiting heap (priority policy; empty otherwise)
    int32_t w_head                   # FCFS: index of the head in the ring
    int32_t n_waiting
    req_t* skipped                   # [n_reqs] requests skipped by this step's waiting pass
    bint finished_pending            # finished_req_ids not yet reported by a schedule()
    req_t* finished                  # [n_reqs] requests finished by the last update
    int32_t n_finished
    int32_t cap                      # capacity of the per-step arrays of a BatchC
    GapsC* gaps                      # the engine's record of gaps between outputs (NULL: none kept)
    # speculative-decoding totals
    int64_t verifications            # entries that verified real drafts
    int64_t padded_requests          # entries admitted with the -1 padding
    int64_t padded_tokens            # their padding tokens
    int64_t draft_feeds              # sync: requests handed k drafts after a step (update_draft_token_ids)
    int64_t stat_drafts              # SpecDecodingStats.num_drafts (update_from_output)
    int64_t stat_draft_tokens        # SpecDecodingStats.num_draft_tokens
    int64_t stat_accepted            # SpecDecodingStats.num_accepted_tokens
    # disaggregated prefill/decode (a deployment's pools)
    int32_t n_remote                 # decode replica: waiting requests whose KV comes from a prefill replica
    tok_t* aware_cached              # [aware_window] scratch: cached tokens of the window's plain requests
    req_t* aware_reqs                # [aware_window] scratch: those requests
    int32_t* aware_pos               # [aware_window] scratch: their places in the waiting queue
    # KV offload behind the GPU cache (ext/offload.pxi; NULL without it; owned by the engine)
    OffloadC* off

cdef int sched_init(SchedC* s, SchedConfC conf, KVCacheC* kv, ReqC* reqs, req_t n_reqs) except -1 nogil
cdef void sched_release(SchedC* s) noexcept nogil
cdef int batch_init(BatchC* b, int32_t cap) except -1 nogil
cdef int batch_grow(BatchC* b, int32_t old, int32_t cap) except -1 nogil
cdef void batch_release(BatchC* b) noexcept nogil
cdef int32_t sched_cap(const SchedConfC* conf, int64_t n_reqs) noexcept nogil
cdef int sched_add_request(SchedC* s, req_t r) except -1 nogil
cdef bint sched_has_requests(const SchedC* s) noexcept nogil
cdef bint sched_has_unfinished(const SchedC* s) noexcept nogil
cdef int sched_schedule(SchedC* s, BatchC* b) except -1 nogil
cdef int sched_update(SchedC* s, const BatchC* b) except -1 nogil
cdef int sched_admit_waiting(SchedC* s, BatchC* b, tok_t lpt) except -1 nogil
cdef int sched_end_schedule(SchedC* s, BatchC* b) except -1 nogil
cdef tok_t sched_step_lpt(const SchedC* s) noexcept nogil
cdef void sched_free_held(SchedC* s, req_t r) noexcept nogil
cdef sec_t sched_next_landing(const SchedC* s) noexcept nogil
cdef int off_init(OffloadC* o, OffConfC conf, int32_t chunk_row, int32_t slots, int32_t jobs) except -1 nogil
cdef void off_release(OffloadC* o) noexcept nogil
cdef int disk_init(OffloadC* o, DiskConfC conf, int32_t slots) except -1 nogil
cdef sec_t off_next_landing(const OffloadC* o) noexcept nogil
# A KV offload tier in the engine's macro-steps (ext/offload.pxi, ext/offload_worker.pxi).
cdef int64_t off_quiet_bound(const SchedC* s, const ReqC* r) noexcept nogil
cdef int off_stamp_one(SchedC* s, ReqC* r, step_t step) except -1 nogil
cdef int off_quiet_meta(SchedC* s, BatchC* b) except -1 nogil
cdef int off_worker_output(SchedC* s, step_t step, sec_t start_s, sec_t end_s) except -1 nogil
