# vLLM's KV-cache manager over one shared block pool, with one manager per
# KV-cache group behind a coordinator: prefix lookup (the hybrid fixed point),
# admission arithmetic, allocation, caching with retention masks, window and
# state releases, copy-on-write partial hits and frees.  cimported by
# scheduler (schedule/update), engine (set-up, telemetry), and for the structs
# by hashing, kvrows, the state managers (statecache.pxi), constants and testing.  Mirrors
# vllm/v1/core/kv_cache_manager.py, kv_cache_coordinator.py and
# single_type_kv_cache_manager.py of every release aisim models (``rules``; EAGLE block drop
# and lookahead hashes included).
from aisim._core.blockpool cimport BlockPoolC
from aisim._core.request cimport ReqC
from aisim._core.types cimport RulesC, block_id_t, flag_t, hash_t, int32_t, int64_t, slot_t, tok_t

cdef enum GroupKind:
    GK_FULL = 0        # FullAttentionManager
    GK_SWA = 1         # SlidingWindowManager
    GK_CHUNKED = 2     # ChunkedLocalAttentionManager
    GK_MAMBA = 3       # MambaManager (Mamba, GDN, KDA state)
    GK_RING = 4        # CircularBufferManager: one block per request, never cached

cdef enum:
    MAX_GROUPS = 64    # KV-cache groups one engine may have

cdef struct GroupSpecC:
    # What the configuration says of one group (validated in Python).
    int32_t kind               # GroupKind
    tok_t block_size           # tokens per block of this group
    tok_t window               # sliding_window (SWA) or attention_chunk_size (chunked local)
    bint cacheable             # prefix_cacheable
    bint align_mode            # Mamba: mamba_cache_mode == "align"
    int32_t num_spec           # Mamba: num_speculative_blocks
    bint has_ckpt              # Mamba: num_prefill_checkpoint_blocks > 0
    tok_t ckpt_align           # Mamba: prefill_checkpoint_alignment (0 = None)
    int32_t admission_cap      # max_admission_blocks_per_request (-1 = none)
    int32_t spec_group         # lookup spec-group of a cacheable group (-1 = none)

cdef struct GroupC:
    GroupSpecC spec            # what the configuration says
    int32_t ratio              # block_size // hash_block_size (cacheable groups)
    int32_t table_row          # table entries per request row
    block_id_t* tables         # [cap_slots * table_row] block tables (0 = null block)
    int32_t* table_len         # [cap_slots]
    int32_t* num_cached        # [cap_slots] num_cached_block; -1 while absent
    int32_t* partial_idx       # [cap_slots] _partial_hit_reqs: table index (-1 = none)
    block_id_t* partial_src    # [cap_slots] _partial_hit_reqs: source block
    int32_t* last_state        # [cap_slots] Mamba last_state_block_idx (-1 = none)
    int32_t* retired           # [cap_slots] Mamba _num_retired_blocks
    flag_t* allocated          # [cap_slots] Mamba _allocated_block_reqs
    tok_t* ckpt_pos            # [cap_slots] Mamba _checkpoints position (0 = none)
    int32_t* ckpt_idx          # [cap_slots] Mamba _checkpoints table index
    block_id_t* hit            # [table_row] hit blocks of the last lookup
    int32_t hit_n              # hit blocks of the last lookup
    hash_t* cts                # [cts_cap] Mamba cached_blocks_this_step (keys)
    int32_t cts_n              # keys held
    int32_t cts_cap            # keys allocated
    block_id_t* retained       # [ret_cap] copy-on-write retentions (source, copy) of this step
    int32_t ret_n              # entries held (two per retention)
    int32_t ret_cap            # entries allocated

cdef struct KVCacheC:
    BlockPoolC pool            # the one block pool of the engine
    int32_t n_groups           # KV-cache groups (1 .. MAX_GROUPS)
    GroupC* groups             # [n_groups] in group-id order
    int32_t n_spec             # lookup spec-groups, full attention first
    int32_t* spec_first        # [n_spec] first member in spec_members
    int32_t* spec_count        # [n_spec]
    int32_t* spec_members      # [n_groups] group ids, spec-group by spec-group
    tok_t hash_block_size      # granularity of a request's block hashes
    tok_t sched_block_size     # scheduler block size (lcm of group block sizes)
    tok_t align                # cache_hit_alignment_tokens
    bint caching               # enable_prefix_caching
    bint hybrid                # HybridKVCacheCoordinator (several groups)
    bint fine                  # enable_partial_hash_hits
    RulesC rules               # the release's rule switches (aisim/config/versions.py)
    tok_t retention            # prefix_cache_retention_interval; -1 = None (dense)
    tok_t max_model_len        # longest sequence
    block_id_t watermark_blocks  # blocks kept free when admitting waiting requests
    # token identity of every request (owned by the engine)
    const hash_t* seg_stream   # [segments] token stream of each prompt segment
    const tok_t* seg_first     # [segments] its first token offset
    const tok_t* seg_len       # [segments] its length
    # per-request rows, by slot
    slot_t cap_slots           # rows allocated
    slot_t n_free_slots        # rows on the free stack
    slot_t* free_slots         # [cap_slots] stack of unused rows
    int32_t hash_row           # hashes per row: max_model_len // hash_block_size + 1
    hash_t* hashes             # [cap_slots * hash_row] chained hashes at hash_block_size
    int32_t* num_hashed        # [cap_slots]
    int32_t* cur_seg           # [cap_slots] hashing cursor: segment (seg_cnt = the output)
    tok_t* cur_off             # [cap_slots] hashing cursor: offset inside that segment
    flag_t* mask               # [max table_row] scratch: retention mask
    tok_t* tmp_hit_len         # [n_spec] scratch of the hybrid lookup
    flag_t* tmp_looked         # [n_spec]
    block_id_t* tmp_blocks     # [n_groups] scratch: blocks of one joint probe
    # speculative decoding (set after kv_init; 0 without it; last, so the hot fields keep their places)
    bint eagle                 # EAGLE/MTP block drop on every group (0.31/0.32 use_eagle_block_drop)
    tok_t hash_lookahead       # num_hash_lookahead_tokens: tokens after a block its hash covers (0.33)
    flag_t* tmp_verified       # [n_spec] EAGLE drop applied at the current candidate length
    # a deployment's router (ext/deploy.pyx): its ids of the keys this group caches (set after kv_init)
    int32_t tag_group          # the group whose full blocks carry the router's ids (-1: none)
    const int32_t* tag_ids     # the router's id of every prompt block key (ReqC.tag_off indexes it)
    block_id_t reserved        # free blocks an admission must leave alone (allocate_slots' reserved_blocks:
                               # a KV connector's asynchronous load; 0 otherwise)
    const hash_t* pre_hashes   # the router's chain hash of every prompt hash block, or NULL (as tag_ids;
                               # set when its blocks are hash blocks): a request's prompt is not hashed again
    hash_t* tmp_keys           # [max table_row] scratch: the keys of the blocks one call caches
    const int32_t* run_node    # the node (BlockPoolC.n_nodes) of every run of every request (ReqC.node_off)
    hash_t* node_hash          # the hashes of the blocks ending in each node's run, as first computed
    int64_t* node_hash_base    # [n_nodes + 1] each node's first entry in node_hash (the last: its size)
    int32_t* node_hash_n       # [n_nodes] entries computed so far

cdef int kv_init(KVCacheC* kv, block_id_t num_blocks, int32_t n_groups, const GroupSpecC* specs,
                 tok_t hash_block_size, tok_t sched_block_size, bint fine, bint caching,
                 tok_t retention, RulesC rules, tok_t max_model_len,
                 block_id_t watermark_blocks, slot_t initial_slots) except -1 nogil
cdef void kv_release(KVCacheC* kv) noexcept nogil
cdef int specs_from_dicts(object groups, GroupSpecC* out) except -1
cdef int kv_acquire_slot(KVCacheC* kv, ReqC* r) except -1 nogil
cdef void kv_release_slot(KVCacheC* kv, ReqC* r) noexcept nogil
cdef void kv_new_step_starts(KVCacheC* kv) noexcept nogil
cdef tok_t kv_get_computed_blocks(KVCacheC* kv, ReqC* r) noexcept nogil
cdef int kv_allocate_slots(KVCacheC* kv, ReqC* r, tok_t num_new_tokens, tok_t num_new_computed,
                           bint full_sequence_must_fit, bint has_scheduled_reqs,
                           tok_t num_lookahead, bint delay_cache) except -1 nogil
cdef int kv_cache_blocks(KVCacheC* kv, ReqC* r, tok_t num_tokens) except -1 nogil
cdef void kv_free(KVCacheC* kv, ReqC* r) noexcept nogil
cdef bint kv_lazy_ok(const KVCacheC* kv) noexcept nogil
cdef int kv_key_lazy(KVCacheC* kv, ReqC* r) except -1 nogil
cdef int kv_arrive(KVCacheC* kv, ReqC* r) except -1 nogil
cdef int kv_node_hashes(KVCacheC* kv, int32_t n_nodes, const int32_t* longest) except -1 nogil
cdef void kv_depart(KVCacheC* kv, ReqC* r) noexcept nogil
cdef void kv_end_schedule(KVCacheC* kv) noexcept nogil
cdef block_id_t kv_active_blocks(const KVCacheC* kv) noexcept nogil
cdef tok_t kv_decode_period(const KVCacheC* kv, flag_t* works, tok_t cap) noexcept nogil
cdef bint kv_decode_settled(const KVCacheC* kv, const ReqC* r) noexcept nogil

