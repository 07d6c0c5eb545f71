# Per-request state shared by the KV-cache manager, the scheduler and the
# engine loop.  Declarations only; cimported by kvcache, scheduler and engine.
# Field meanings follow vllm/v1/request.py (Request) for 0.31/0.32.
from aisim._core.types cimport flag_t, hash_t, int32_t, int64_t, req_t, sec_t, slot_t, tok_t

# vllm/v1/request.py RequestStatus, reduced to what the default path visits.
cdef enum ReqStatus:
    ST_PENDING = 0      # not yet arrived
    ST_WAITING = 1
    ST_RUNNING = 2
    ST_PREEMPTED = 3
    ST_FINISHED = 4     # FINISHED_LENGTH_CAPPED: max_tokens or max_model_len reached

cdef struct ReqC:
    # --- from the trace (read-only in the core)
    tok_t prompt_len           # num_prompt_tokens
    tok_t max_tokens           # SamplingParams.max_tokens (EOS ignored)
    int32_t priority           # lower runs first (priority policy)
    sec_t arrival_key          # Request.arrival_time: the trace's arrival step or time
    int32_t id_rank            # rank of request_id in string order (heap tie-break)
    int32_t seg_off            # first prompt segment in the engine's segment arrays
    int32_t seg_cnt            # number of prompt segments
    hash_t out_stream          # token stream of this request's output tokens
    int32_t next_turn          # closed loop: the request sent when this one finishes (-1 = none)
    sec_t think_s              # closed loop: seconds between the previous turn's finish and this one
    # --- scheduler state
    flag_t status              # ReqStatus
    flag_t is_prefill_chunk    # set after scheduling (Scheduler._update_after_schedule)
    flag_t lazy_keys           # its blocks past key_blocks are cached without keys until it is preempted:
                               # no other request of the trace shares them (kvcache kv_lazy_ok)
    int32_t key_blocks         # while lazy_keys: its leading blocks that get their keys when cached
                               # (another request of the trace may share them; 0 for a private request)
    int32_t node_off           # its first run of tokens (prompt segments, then output) in KVCacheC.run_node
    int32_t node_n             # its leading runs that other requests of the trace hold too (their nodes)
    tok_t num_output           # output tokens appended so far
    tok_t num_computed         # num_computed_tokens, advanced at schedule time
    tok_t num_placeholders     # num_output_placeholders (async scheduling)
    tok_t num_in_flight        # scheduled tokens whose output is not processed yet
    tok_t num_stale            # num_stale_output_tokens (preempted while in flight)
    int32_t num_preemptions
    # --- KV-cache manager state
    slot_t slot                # row of block tables and hashes; -1 when none is held
    tok_t shared_prefix_boundary  # Request.shared_prefix_boundary from the last lookup
    # --- results
    tok_t cached_first         # local prefix hit at the first admission (PrefillStats)
    tok_t cached_total         # local prefix hits summed over every admission
    sec_t sent_s               # when the client sent it: its trace arrival, the release of the client's cap,
                               # or a closed-loop turn's release (time-clocked); the clock that added it (step-clocked)
    sec_t picked_up_s          # clock when the engine added it (the start of the iteration that picked it up)
    sec_t first_sched_s        # clock of the first step that scheduled it (-1: never)
    sec_t first_token_s        # end of the step that produced its first output (-1: none)
    sec_t finish_s             # end of the step that produced its last output (-1: unfinished)
    sec_t last_token_s         # end of the step that produced its latest output (read once it has one)
    # --- speculative decoding (untouched without it; last, so the hot fields keep their places)
    tok_t num_spec             # len(spec_token_ids): drafts (async: placeholders) for the next step
    int32_t acc_off            # first entry of its trace `accept` list in the engine's array
    int32_t acc_cnt            # ... and its length (0: the configured acceptance rule)
    int32_t num_verifications  # steps that verified its drafts so far (padding excluded)
    tok_t spec_drafts          # draft tokens scheduled for verification (-1 padding included)
    tok_t spec_accepted        # of those, accepted by the target model
    int64_t trace_index        # its place in the trace: seeds the acceptance rule
    # --- disaggregated prefill/decode (untouched in a single engine or an aggregated deployment)
    flag_t remote              # decode replica: 1 = its prompt KV comes from a prefill replica, not yet
                               # admitted; 2 = admitted, blocks held (WAITING_FOR_REMOTE_KVS); 0 = none
    flag_t held                # prefill replica: its blocks outlive its finish until the transfer lands
    sec_t remote_s             # decode replica: when the transfer lands
    # --- a deployment's router ids (untouched in a single engine: zero = no ids)
    int64_t tag_off            # its first prompt block's entry in KVCacheC.tag_ids
    int32_t tag_n              # its full prompt blocks with an id there
    flag_t tag_look            # its other full blocks: 1 = a router may read their keys (TAG_LOOKUP)
    # --- KV offload (ext/offload.pxi; untouched without it)
    int32_t off_next           # RequestGroupState.next_stored_chunk_idx
    int32_t off_jobs           # RequestOffloadState.transfer_jobs in flight
    tok_t off_local            # num_locally_computed_tokens of its last lookup
    int64_t off_rank           # the LRU policy's rank of the request (0: none yet)
    int32_t off_node           # its rank's anchor in the tier's LRU list (while off_rank > 0)
    flag_t off_park            # 1 WAITING_FOR_REMOTE_KVS, 2 its load reported (finished_recving),
                               # 3 promoted but not scheduled yet; 0 otherwise
    flag_t off_inflight        # in Scheduler._inflight_prefills
    flag_t off_hold            # finished; the connector still holds its state (keys, jobs)
    int32_t off_reserved       # Scheduler._parked_reservations entry (blocks; 0 none)
    int32_t off_nblocks        # GPU blocks it held when it finished
    int32_t off_tlen           # GPU blocks it held after its last schedule() (0: none yet this admission)
    tok_t off_hit_first        # tokens loaded from the CPU tier at its first admission
    tok_t off_loaded           # tokens loaded from the CPU tier over every admission
    int32_t off_n_loads        # its load jobs
    int64_t off_store_chunks   # chunks its store jobs wrote
    int64_t off_disk_read      # chunks its lookups read back from the disk tier (promotions)
    int32_t off_priv           # 1 + its first chunk no other request of the trace shares (kept out of
                               # the tier's key map: _off_priv_from); 0 until the connector first sees it
