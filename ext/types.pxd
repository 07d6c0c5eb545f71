# Every C type name of the replay core, fixed in width and named for its meaning.
# cimported by every other module of ext/; nothing else writes raw C integer types.
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t

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
