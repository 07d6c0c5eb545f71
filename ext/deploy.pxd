# A deployment: N replicas of the engine (engine.pxd Engine, each with its own scheduler, KV
# cache and step time) on one simulated clock, behind a router.  cimported by nothing; the
# Python side (aisim.replay.run_deployment) builds it from a CoreConfig, a time-clocked open-loop
# CoreTrace and the router's settings, runs it once and takes each replica's rows.
from aisim._core.engine cimport TraceC
from aisim._core.types cimport flag_t, hash_t, int32_t, int64_t, sec_t, tok_t

# Routers (aisim/config/routers.py ROUTER_TABLE names each by this enum's names).
cdef enum RouterKind:
    RT_ROUND_ROBIN = 0         # request k goes to replica k mod N
    RT_RANDOM = 1              # a seeded splitmix64 draw
    RT_LEAST_LOADED = 2        # fewest outstanding requests (or tokens), ties to the lowest index
    RT_KV_AWARE = 3            # Dynamo's cost: weight * prefill_tokens / B + decode_blocks, lowest wins
    RT_SESSION = 4             # a session's turns stick to one replica; fallback when it is overloaded

# What a replica reports to the router after an iteration (seen view_delay_s later).
cdef enum DeltaKind:
    DK_KEY_ADD = 0             # a prompt block's key entered the replica's prefix cache (value: its id)
    DK_KEY_DEL = 1             # ... left it
    DK_FIRST = 2               # a request produced its first token: its prefill booking ends
    DK_FINISH = 3              # a request finished: its load and active blocks are released

cdef struct NodeC:
    # One edge of the router's prefix index: consecutive prompt blocks that the same requests of
    # the trace share (every request's prompt ends on a node's last block).
    hash_t am                  # bit w: an outstanding request on w passes through it
    int32_t first              # id of its first block; its blocks are ids first .. first + n - 1
    int32_t n                  # blocks on it
    int32_t crow               # its row of per-replica counts while any replica has it active (-1: none)

cdef struct PrefixIndexC:
    # The router's one index of the trace's prompt blocks, as Dynamo's KV router keeps a radix
    # tree: built once from every request's prompt keys (a compressed prefix tree whose blocks
    # get dense ids), it holds per block id which replicas cache it (their KV events) and per node
    # which replicas have it active (the router's bookings), with counts while they do.
    NodeC* node                # [n_nodes]
    int32_t n_nodes
    int32_t n_ids              # distinct prompt block keys of the trace
    hash_t* cm                 # [n_ids] bit w: replica w caches the block's key
    int32_t n_rep              # counts per row
    int32_t* cnt               # [rows_cap * n_rep] outstanding requests passing through, per replica
    int32_t* row_next          # [rows_cap] free list of rows
    int32_t rows_cap
    int32_t row_free           # head of the free list (-1: empty)
    # key -> id, for keys a block tag cannot name (TAG_LOOKUP: output blocks a later prompt quotes);
    # built only when some request's output is quoted.  Open addressing, linear probing.
    hash_t* lk_key             # [lk_mask + 1] (0: empty)
    int32_t* lk_id
    hash_t lk_mask

cdef struct DeltaC:
    sec_t stamp                # start of the iteration that produced it
    int32_t replica
    int32_t kind               # DeltaKind
    hash_t value               # the block's id, or the request's trace index

cdef struct DeltaQC:
    # FIFO ring of deltas not yet visible to the router.
    DeltaC* a                  # [cap]
    int64_t cap                # a power of two
    int64_t head
    int64_t n

cdef struct RouterC:
    int32_t kind               # RouterKind
    int32_t n_rep              # replicas (at most 64: the cache index holds a bitmask per key)
    bint by_tokens             # least_loaded: outstanding tokens instead of requests
    double weight              # kv_aware: overlap_score_weight
    int32_t fallback           # session_affinity: RT_KV_AWARE or RT_LEAST_LOADED
    int64_t slack              # session_affinity: overloaded when outstanding > least + slack
    sec_t delay                # view_delay_s
    hash_t rng                 # random: splitmix64 state
    int64_t rr                 # round_robin: the next replica
    bint kv                    # keep the cache index and the active-block maps
    tok_t block                # B: the full-attention group's block size
    tok_t hash_block           # the hash block size (B is a multiple of it)
    int32_t group              # the full-attention group's id (its pool keys)
    # the router's view, per replica
    int64_t* out_reqs          # [n_rep] outstanding requests (booked at routing, released at finish)
    int64_t* out_toks          # [n_rep] their prompt + max output tokens
    int64_t* pf_toks           # [n_rep] booked prefill tokens (released at the first token)
    int64_t* act_n             # [n_rep] distinct active prompt-block keys
    PrefixIndexC idx           # prompt blocks -> caching replicas; nodes -> active replicas, counts
    DeltaQC q                  # reported, not yet visible
    # per request of the trace
    int64_t* key_off           # [n + 1] its prompt-block keys: keys[key_off[i] : key_off[i + 1]]
    hash_t* keys
    int32_t* kid               # [key_off[n]] each key's id in the index (kv routers)
    int64_t* path_off          # [n + 1] its path of nodes: path[path_off[i] : path_off[i + 1]]
    int32_t* path
    flag_t* quoted             # [n] a later prompt quotes its output (its output blocks: TAG_LOOKUP)
    int64_t* booked_pf         # [n] prefill tokens booked at routing
    flag_t* pf_open            # [n] booking not yet released
    int64_t* session           # [n] session number (-1: none)
    int32_t* sticky            # [n_sessions] replica of the session (-1: not yet)
    # scratch, per replica
    int64_t* overlap           # [n_rep] leading prompt blocks cached (the router's view)
    double* cost               # [n_rep]
    int64_t* cover             # [n_rep] leading prompt blocks active there

cdef struct LinkC:
    # The prefill-to-decode KV transfer link of a disaggregated deployment.
    double bandwidth           # bytes per second (may be infinite)
    double latency             # seconds added to every transfer
    bint missing               # move only the blocks the decode replica does not cache
    double block_bytes         # bytes of one block id (aisim.config.kvgroups.block_bytes)
