# Chained block hashes over compact token identities.  cimported by kvcache
# (lookups and caching), kvrows (the probe's group keys) and testing; the
# chain of one request is computed in hashing.pyx (hash_extend).
#
# aisim never materialises token arrays.  A request's tokens are a list of
# *segments* (token stream id, first offset, length): token k of a segment is
# token (stream, first + k).  Two requests share a token iff they share
# (stream, offset).  A block's hash mixes its parent's hash with the runs
# (stream, first offset, length) of the tokens inside the block, so two
# requests share a block hash iff they share every token of that block and of
# every block before it -- the property vLLM's sha256 chain has
# (vllm/v1/core/kv_cache_utils.py, hash_block_tokens).  Callers canonicalise
# segments (adjacent contiguous runs of one stream merged) so that any
# decomposition of the same tokens yields the same hashes.
from aisim._core.kvcache cimport KVCacheC
from aisim._core.request cimport ReqC
from aisim._core.types cimport hash_t, int32_t, int64_t, tok_t
from aisim._core.util cimport mix64

# Seed of every chain (vLLM's NONE_HASH plays this role).
cdef enum:
    NONE_HASH_SEED = 0x5eed5eed

cdef inline hash_t hash_combine(hash_t h, hash_t v) noexcept nogil:
    return hash_combine_mixed(h, mix64(v))

cdef inline hash_t hash_combine_mixed(hash_t h, hash_t mixed) noexcept nogil:
    # hash_combine(h, v) given mixed = mix64(v): a value mixed once serves many combines.
    return mix64(h ^ (mixed + <hash_t>0x9e3779b97f4a7c15 + (h << 6) + (h >> 2)))

# A block's key is hash_combine_mixed(parent key, the digest of its tokens' runs): the digest
# does not depend on the chain, so a chain step is one mix (and the next block's digest can be
# computed while it waits).  Roles of a run's three numbers, kept apart (C enum values: 31 bits):
cdef enum:
    RUN_FIRST = 0x66697273         # added to the run's first offset
    RUN_LENGTH = 0x6c656e67        # added to its length
    RUN_NEXT = 0x6e657874          # a block's later runs: order-sensitive fold

cdef inline hash_t length_mix(tok_t length) noexcept nogil:
    # The length's part of run_digest, made once for the many runs of one block size.
    return mix64(<hash_t>length + <hash_t>RUN_LENGTH)

cdef inline hash_t run_digest(hash_t stream, tok_t first, hash_t mixed_length) noexcept nogil:
    # One run of consecutive tokens of one stream inside a block: (stream, first offset,
    # length), the length given as length_mix(length).
    return mix64(mix64(stream) ^ mix64(<hash_t>first + <hash_t>RUN_FIRST) ^ mixed_length)

cdef inline hash_t digest_then(hash_t digest, hash_t run) noexcept nogil:
    # The digest of a block's runs so far, then one more run (run_digest): in order.
    return mix64(digest ^ <hash_t>RUN_NEXT) ^ run

cdef inline hash_t hash_finish(hash_t h) noexcept nogil:
    # 0 means "no hash" in the block pool, so a finished hash is never 0.
    return h if h != 0 else <hash_t>1

cdef inline hash_t group_key(hash_t block_hash, int group) noexcept nogil:
    # vLLM keys its map by (block hash, KV-cache group id)
    # (vllm/v1/core/kv_cache_utils.py, make_block_hash_with_group_id).
    return hash_finish(hash_combine(block_hash, <hash_t>(group + 1)))


# Extend a request's chained hashes up to hash block ``n_hashes`` (exclusive).
cdef void hash_extend(KVCacheC* kv, ReqC* r, int32_t n_hashes) noexcept nogil
# The same chain over a prompt's segments, at every ratio-th hash block (a deployment's router).
cdef int64_t hash_prompt(const hash_t* stream, const tok_t* first, const tok_t* length, int32_t n_seg,
                         tok_t prompt_len, tok_t size, int32_t ratio, hash_t* out, int64_t start) noexcept nogil
