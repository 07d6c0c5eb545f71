# KV offload behind the GPU cache: vLLM's OffloadingConnector with its CPU tier, as its scheduler
# side runs it (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py,
# OffloadingConnectorScheduler; vllm/v1/kv_offload/cpu/manager.py, CPUOffloadingManager;
# cpu/policies/lru.py, LRUCachePolicy) and the worker's transfers on a step-driven clock.
# Declarations only; the functions are ext/offload.pxi, compiled into the scheduler module.
from aisim._core.types cimport block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t, uint32_t


cdef struct OffConfC:
    int32_t cpu_chunks           # CPU tier size in offloaded blocks (chunks)
    tok_t tokens_per_chunk       # block_size * blocks_per_chunk
    int32_t hashes_per_chunk     # tokens_per_chunk // hash block size
    bint prompt_only             # offload_prompt_only
    step_t load_delay            # a load issued in step N is reported by step N + load_delay
    step_t store_delay           # a store issued in step N is reported by step N + store_delay
    int32_t max_inflight_loads   # max_num_inflight_kv_loads (0: no cap)
    int64_t chunk_bytes          # bytes of one chunk
    double link_bps              # > 0: transfers take chunk_bytes / link_bps seconds a chunk, one at a
                                 # time per direction (the delays in steps are then unused)


cdef struct OffChunkC:
    # One chunk of the CPU tier (ChunkStatus plus the LRU policy's per-key state).
    hash_t key                   # the offload key it holds (a block hash)
    int32_t ref                  # ChunkStatus.ref_cnt: -1 while being stored, else readers in flight
    flag_t loading               # in OffloadingConnectorScheduler._chunks_being_loaded
    flag_t watch                 # one of the chunks the last lookup's scan found (OffloadC.memo);
                                 # with a disk tier, how many kept scans found it (DiskC.memos)
    flag_t used                  # holds its key (taken from free_chunks, not evicted since)
    int64_t rank_hi              # LRUCachePolicy._ranks: (request rank or renewal rank,
    int64_t rank_lo              #   -position or 0); the smallest is evicted first


cdef struct OffLinkC:
    # A node of the tier's LRU list: its neighbours and, for a chunk's node, what an eviction's walk
    # reads of the chunk (all in one fetch), its key map bucket fetched as the walk selects it.
    int32_t prev
    int32_t next
    uint32_t tag                 # the low 32 bits of its key's mix (its home bucket's bits among them)
    flag_t evictable             # LRUCachePolicy._evictable
    flag_t mark                  # protected from one eviction (1): the chunks a store offers
    flag_t mapped                # the key map has its key (1), the dense key array has it (2: ``tag``
                                 # is then its dense id, _off_dense_fill), or neither (0: the key is no
                                 # other request's and only its own request finds it, through its
                                 # hint: _off_own)


cdef struct OffMapE:
    # A bucket of the tier's key map, eight bytes: the low 32 bits of the key's mix (its home
    # bucket's bits among them) and the chunk holding the key, whose own key confirms a match.
    uint32_t tag
    int32_t chunk                # the chunk holding it (-1: empty)


cdef struct OffJobC:
    # One transfer job (TransferJobStatus); its slot is reused once the job is reported.
    int64_t id                   # job id (one counter shared by loads and stores)
    req_t req                    # the request's slot in the engine
    flag_t store                 # 1 store, 0 load
    flag_t flushed               # listed in jobs_to_flush
    flag_t active                # in flight (else a free slot)
    step_t issued                # the step whose schedule() issued it (its batch's step)
    step_t due                   # the step whose output first may report it (delays in steps)
    sec_t due_s                  # when it lands (transfers on the clock; -1: at once)
    int32_t n_keys
    int32_t keys_cap
    hash_t* keys                 # [keys_cap] the keys it reads or writes, in order
    int32_t* cids                # [keys_cap] the chunks holding them (pinned or being stored: they
                                 # stay in the tier until the job is reported)
    # A store's GPU source blocks (deferred_fence_block_ids), watched once its request finished
    # (ext/offload_fence.pxi).
    flag_t fenced                # its blocks are in _block_id_to_pending_jobs
    step_t listed                # the last step whose jobs_to_flush lists it (-1: none)
    int32_t n_blocks
    int32_t blocks_cap
    block_id_t* blocks           # [blocks_cap] its source blocks


# What one record of a step says (OffRecC.kind).
cdef enum OffRec:
    OR_LOOKUP = 0                # get_num_new_matched_tokens: req, a = local hit, b = tokens offered (-1: None)
    OR_LOAD = 1                  # a load job: id, req, a = num_external_tokens, b = chunks read
    OR_STORE = 2                 # a store job: id, req, b = chunks written
    OR_FLUSH = 3                 # a job in jobs_to_flush: id, req
    OR_DONE = 4                  # a job the worker reported finished: id, req, a = 1 for a store
    OR_RECV = 5                  # finished_recving: req


cdef struct OffRecC:
    int32_t kind                 # OffRec
    req_t req
    int64_t id
    int64_t a
    int64_t b


# ------------------------------------------------------------------ the disk tier (ext/offload_disk.pxi)
# vLLM 0.34.0's TieringOffloadingSpec with one `fs` secondary tier (v1/kv_offload/tiering/manager.py,
# TieringOffloadingManager; tiering/fs/manager.py, FileSystemTierManager; tiering/async_lookup.py).

cdef struct DiskConfC:
    step_t read_delay            # a promotion issued in step N is reported by the schedule() of step N + this
    step_t write_delay           # a cascade issued in step N's output is reported by step N + this
    double read_bps              # > 0 (with the PCIe link on the clock): a read lasts its bytes over this
    double write_bps             # ... and a write


cdef struct DiskEntC:
    # One key the disk tier knows: its file, and the async lookup's verdict held for requests.
    hash_t key
    flag_t used                  # the bucket holds a key
    flag_t on_disk               # its file is written (the write was reported)
    flag_t writing               # a write of it is in flight
    int32_t refs                 # requests holding its lookup (LookupState.request_ids); 0: no state
    step_t ready                 # the lookup's verdict is known from this step on


cdef struct DiskJobC:
    # One job of the fs tier's thread pool: a cascade (CPU -> disk) or a promotion (disk -> CPU).
    flag_t promote               # 1 promotion, 0 cascade
    flag_t active
    void* owner                  # the request whose lookups gathered a promotion (this step only)
    step_t due                   # the first schedule() that reports it (delays in steps)
    sec_t due_s                  # when it lands (on the clock)
    int32_t n_keys
    int32_t keys_cap
    hash_t* keys


cdef struct ScanMemoC:
    # A request's last lookup scan, kept while asking again changes no tier: the CPU tier's one
    # (OffloadC.memo, off_lookup) or, with a disk tier, up to DISK_MEMOS through both tiers, one a
    # request (DiskC.memos, disk_scan).
    flag_t on
    req_t req                    # the request (engine slot) with its KV row, arrival and id rank
    int32_t slot
    sec_t arrival
    int32_t rank
    int32_t start                # the chunks scanned: start .. end - 1
    int32_t end
    int32_t hits                 # chunks present from start (past a RETRY too)
    flag_t pending               # one of them is being stored or promoted, or the disk said RETRY
    flag_t loading               # one of them is being loaded
    flag_t missed                # the scan stopped at ``miss``: no CPU chunk, a held "absent" verdict
    hash_t miss
    int32_t* chunks              # [chunk_row] the chunks found (hits)


cdef struct DiskC:
    DiskConfC conf
    ScanMemoC* memos             # [DISK_MEMOS] kept lookup scans (disk_scan)
    int32_t memo_cur             # the one the last lookup answered from
    int32_t memo_next            # the next replaced when all are kept
    DiskEntC* map                # open addressing, grown at half full; no entry is ever removed
    int64_t map_mask
    int64_t n_ent
    DiskJobC* jobs               # [jobs_cap]
    int32_t jobs_cap
    int32_t n_jobs               # jobs in flight (the manager's _jobs)
    int32_t* gather              # [jobs_cap] promotions gathered by this step's lookups, in order
    int32_t n_gather
    flag_t* looked               # [looked_slots * chunk_row] chunks a request's lookup took to the disk
    int32_t looked_slots
    step_t step                  # the step being scheduled (set by its first poll)
    step_t out_step              # the engine line processing the output (async: its step + 1)
    sec_t out_s                  # ... and when that output came
    sec_t read_free_s
    sec_t write_free_s
    # totals
    int64_t queries              # chunk lookups that reached the disk tier
    int64_t retries              # ... answered RETRY (verdict not known yet)
    int64_t hits                 # ... found on disk
    int64_t promotions           # promotion jobs
    int64_t promoted_chunks      # chunks read from disk into the CPU tier
    int64_t promote_failed       # hits the CPU tier had no room for (MISS)
    int64_t cascades             # cascade jobs
    int64_t cascade_chunks       # chunks offered to the disk
    int64_t written_chunks       # chunks written (not already on disk)
    int64_t on_disk              # chunks on disk
    # this step (the step row's columns; reset when the row is written)
    int32_t st_queries
    int32_t st_hits
    int64_t st_read                # chunks the step's promotions read
    int64_t st_written             # chunks the step's cascades write
    # the last step whose promotion evicted a chunk of the promoting request (-1: none): its
    # lookup cannot end (the replay's stall error names it, ext/engine_disk.pxi)
    step_t self_evict_step


cdef struct OffloadC:
    OffConfC conf
    DiskC* disk                  # the disk tier behind the CPU tier (NULL: none)
    # --- the CPU tier
    OffChunkC* chunks            # [cpu_chunks]
    int32_t* free_chunks         # [cpu_chunks] stack of unused chunks
    int32_t n_free_chunks
    int64_t map_mask             # key map: open addressing, power-of-two size - 1
    OffMapE* map                 # [map_mask + 1] the buckets (a probe stays in the map)
    int32_t n_used               # chunks holding data (stored or being stored)
    int32_t n_evictable          # _num_evictable_cache_chunks
    int64_t next_rank            # LRUCachePolicy._next_rank
    # The LRU order: one circular doubly linked list over nodes, ascending rank (the first is
    # evicted first).  Nodes 0 .. cpu_chunks - 1 are the chunks holding keys, node cpu_chunks is
    # the list's root, the nodes after it mark where each ranked request's chunks go (its rank's
    # anchor, off_node of the request).
    OffLinkC* lru                # [cpu_chunks + 1 + anchor_cap]
    int32_t* free_anchors        # [anchor_cap] stack of unused anchor nodes
    int32_t n_free_anchors
    int32_t anchor_cap
    int32_t* scratch             # [cpu_chunks] chunks selected by one eviction
    int32_t* found               # [chunk_row] scratch of one store: the chunk of each key offered (-1)
    hash_t* mixes                # [chunk_row] ... and the mix of each key the key map is asked for
    # --- jobs
    int64_t next_job             # _job_counter
    OffJobC* jobs                # [jobs_cap] job slots
    int32_t jobs_cap
    int32_t* free_jobs           # [jobs_cap] stack of unused job slots
    int32_t n_free_jobs
    int32_t n_jobs               # jobs in flight (_jobs)
    int32_t* store_q             # [jobs_cap] ring of submitted stores, in submission order
    int32_t sq_head
    int32_t sq_n
    int32_t* load_q              # [jobs_cap] ring of submitted loads, in submission order
    int32_t lq_head
    int32_t lq_n
    int32_t* deferred            # [jobs_cap] stores of the last step, submitted when the next begins
    int32_t n_deferred
    int32_t* step_loads          # [jobs_cap] loads issued by this step's schedule()
    int32_t n_step_loads
    int32_t* step_stores         # [jobs_cap] stores issued by this step's schedule()
    int32_t n_step_stores
    step_t cur_step              # the step being scheduled (the step its new jobs are issued in)
    # --- flushes of finished requests' stores whose GPU blocks are handed out again
    int32_t n_fenced             # jobs with fenced set
    int64_t* alloc_mark          # [alloc_n] per GPU block: 1 + the last step that handed it to a
    int32_t alloc_n              #   scheduled request (_current_batch_allocated_block_ids)
    # --- requests waiting for their load (WAITING_FOR_REMOTE_KVS), FIFO: Scheduler.kv_holding_waiting
    req_t* parked                # [parked_cap]
    int32_t n_parked
    int32_t parked_cap
    int64_t parked_reserved      # Scheduler._parked_reserved_blocks
    sec_t load_free_s            # transfers on the clock: when the link is free for the next load
    sec_t store_free_s           # ... and for the next store
    # --- the chunks each request has seen (the manager's _RequestCacheAccess.seen_keys), by KV row
    flag_t* seen                 # [seen_slots * chunk_row]
    int32_t* hint                # [seen_slots * chunk_row] the chunk a request's chunk position was last
                                 # found in; a hint only, checked against the chunk (_off_hinted)
    int32_t seen_slots
    int32_t chunk_row            # chunks a request can have
    # --- the dense key array: a shared chunk position's key by the trace's prefix nodes
    # (ext/offload_map.pxi, _off_dense_fill), instead of the key map
    int32_t* dense_id            # [seen_slots * chunk_row] the dense id of each shared position's key (-1: none)
    int32_t* dense               # [n_dense] 1 + the chunk holding each dense id's key (0: none); NULL until used
    int64_t n_dense
    # --- the last lookup's scan of the tier (off_lookup), kept while nothing it read changed: a
    # request held at the waiting queue's head asks again every step.  Dropped when one of the
    # chunks it found (``watch``) is evicted, pinned or completed, or the key where it stopped is
    # stored (_off_map_put, _off_map_del, off_load, _off_complete).  With a disk tier the kept
    # scans are DiskC.memos instead (memo.on: one of them is kept; dropped together).
    ScanMemoC memo
    # --- this step, for the decision log and the step columns (reset by each schedule())
    OffRecC* recs                # [recs_cap] what the connector did, in order
    int32_t n_recs
    int32_t recs_cap
    int32_t step_evicted         # chunks evicted by this step's stores
    # --- totals (the summary)
    int64_t lookups
    int64_t lookups_hit
    int64_t lookups_deferred
    int64_t loads
    int64_t load_tokens
    int64_t load_chunks
    int64_t stores
    int64_t store_chunks
    int64_t flushed
    int64_t evicted
    int64_t completed
    int64_t recving
    int32_t max_wait             # most requests in WAITING_FOR_REMOTE_KVS after a schedule()
    int64_t conn_requests        # connector_prefix_cache_stats (first admissions)
    int64_t conn_queries
    int64_t conn_hits
    int64_t conn_p_requests      # ... and re-admissions after preemption
    int64_t conn_p_queries
    int64_t conn_p_hits
