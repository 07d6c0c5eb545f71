# Every C type name of the replay core, fixed in width and named for its meaning.
# cimported by every other module of ext/; nothing else writes raw C integer types.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t

ctypedef uint64_t hash_t      # a block hash, a token-stream id, a map key
ctypedef int32_t block_id_t   # a physical KV-cache block id; 0 is vLLM's null block
ctypedef int64_t tok_t        # a count or position of tokens
ctypedef int32_t req_t        # index of a request in one replay (trace order)
ctypedef int32_t slot_t       # index of a per-request row of block tables and hashes
ctypedef int64_t step_t       # an engine-iteration index
ctypedef double sec_t         # simulated seconds
ctypedef int8_t flag_t        # a small enum or boolean stored in an array

# Compile-time switch of the scheduler: a function taking a ``spec_mode*`` is
# compiled once per member, and ``spec_mode is spec_on_t`` is a constant of
# each copy, so speculative decoding costs nothing when it is off.
ctypedef struct spec_on_t:
    char on
ctypedef struct spec_off_t:
    char off
ctypedef fused spec_mode:
    spec_on_t
    spec_off_t


# One column of a uniform JSON-lines block (ext/tracescan.pyx): the literal before its value (the
# opening brace or the item separator, the key in quotes, the key separator), the value's kind and
# where its values go.  The arrays are the caller's, ``cap`` rows long (``items``: ``item_cap``).
ctypedef struct scan_col_t:
    const uint8_t* lit     # the bytes that precede the value on every line
    int64_t lit_len
    int8_t kind            # SCAN_INT, SCAN_FLOAT, SCAN_STRING, SCAN_LIST (tracescan.pyx)
    int64_t* ints          # int: the values; string: where each value's text starts in the block
    double* floats         # float: the values
    uint8_t* valid         # 1 for a value, 0 for null
    int32_t* offsets       # string: running byte count; list: running item count (cap + 1)
    int64_t* items         # list: the items of all rows
    int64_t nulls          # rows holding null
    int64_t used           # list: items written
    int8_t wide            # string: a byte >= 0x80 was seen (the text needs a UTF-8 check)


# One vLLM release's rules, as named switches (aisim/config/versions.py ``Rules``, the fields of
# ``CORE_RULES``; filled by aisim/core_input.py).  The core reads these and never a version number.
ctypedef struct RulesC:
    bint mamba_split_leaves_last_token          # Scheduler._mamba_block_aligned_split: last = ((n-1)//B)*B
    bint mamba_split_ckpt_in_sched_blocks       # ... checkpoint in scheduler blocks unless fine-grained
    bint ckpt_position_rounds_n_under_drop      # get_mamba_prefill_checkpoint_position under the EAGLE drop
    bint mamba_alloc_ckpt_at_alignment          # MambaManager.get_num_blocks_to_allocate: checkpoint unit
    bint mamba_drafts_capped_first_only         # ... draft blocks in the cap only on the first allocation
    bint mamba_relocate_drafts_with_ckpt        # MambaManager.allocate_new_blocks
    bint mamba_tail_key_leaves_last_token       # MambaManager._cache_partial_tail_block: tail position
    bint mamba_ckpt_key_kept_at_boundaries      # ... which checkpoint keys are kept
    bint full_tail_key_leaves_last_token        # FullAttentionManager._cache_partial_tail_block
    bint mamba_tail_keyed_once                  # MambaManager._cache_partial_tail_block early return
    bint running_pass_continues_after_self_preemption  # Scheduler.schedule running loop
    bint cache_blocks_capped_by_hashes          # SingleTypeKVCacheManager.cache_blocks (drafts)
    bint spec_output_caches_final_blocks        # Scheduler.update_from_output with drafts
    bint long_prefill_cap_needs_chunked_prefill  # Scheduler.schedule: the threshold needs chunked prefill
    bint mamba_sync_output_caches_final_blocks  # Scheduler.update_from_output: sync engine, Mamba, caching


# The gaps between a request's streamed outputs, pooled over every request of a replay (vLLM's
# inter-token latencies: vllm/benchmarks/lib/endpoint_request_func.py appends the time since the
# previous chunk for every chunk after the first; serve.py calculate_metrics pools them).  A chunk
# is one engine step's output for a request, so the requests decoding in one step mostly share
# one gap: the record is (gap, count) pairs, a repeat of a recent gap adding to its count
# (ext/gaps.pxd).  Handed over with the step rows (Engine.take_gaps).
ctypedef struct GapsC:
    int64_t n                  # pairs written
    int64_t cap                # pairs allocated
    double* gap                # [cap] seconds between two consecutive chunks of one request
    int64_t* count             # [cap] chunks that came that long after their request's previous one
