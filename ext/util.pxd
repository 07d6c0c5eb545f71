# Small arithmetic and request helpers shared by the modules of ext/
# (kvcache, scheduler, engine, deploy and the group managers).  Inline: they sit in
# the hottest loops, and a cross-module call of a one-line function costs.
from aisim._core.request cimport ReqC
from aisim._core.types cimport hash_t, tok_t


cdef extern from *:
    # GCC/Clang: a hint that a line will be read soon (no effect on results).
    void __builtin_prefetch(const void* addr) noexcept nogil
    # GCC/Clang: the index of the lowest set bit (x != 0).
    int __builtin_ctzll(unsigned long long x) noexcept nogil


cdef inline hash_t mix64(hash_t x) noexcept nogil:
    # splitmix64's finaliser (Steele, Lea and Flood 2014): a bijective 64-bit avalanche.  The one
    # mixer of the core: block keys (hashing.pxd), token streams (tracescan), draws.
    x ^= x >> 30
    x *= <hash_t>0xbf58476d1ce4e5b9
    x ^= x >> 27
    x *= <hash_t>0x94d049bb133111eb
    x ^= x >> 31
    return x


cdef inline hash_t splitmix64(hash_t x) noexcept nogil:
    # One splitmix64 output for state ``x`` (all arithmetic mod 2**64).
    return mix64(x + <hash_t>0x9e3779b97f4a7c15)


cdef inline tok_t cdiv(tok_t a, tok_t b) noexcept nogil:
    # Ceiling division of non-negative counts (vllm/utils cdiv).
    return (a + b - 1) // b


cdef inline tok_t tmin(tok_t a, tok_t b) noexcept nogil:
    return a if a < b else b


cdef inline tok_t tmax(tok_t a, tok_t b) noexcept nogil:
    return a if a > b else b


cdef inline tok_t num_tokens(const ReqC* r) noexcept nogil:
    # Request.num_tokens: prompt plus the outputs appended so far.
    return r.prompt_len + r.num_output


cdef inline tok_t ckpt_position_v(tok_t n, tok_t unit, bint eagle, bint rounds_n_under_drop,
                                   tok_t lookahead) noexcept nogil:
    # kv_cache_interface.get_mamba_prefill_checkpoint_position: leave
    # max(1, num_hash_lookahead_tokens) tokens, then one unit less with the EAGLE
    # drop; ``rounds_n_under_drop`` (RulesC.ckpt_position_rounds_n_under_drop):
    # the drop already leaves tokens to recompute, so n itself is rounded down.
    cdef tok_t limit
    if eagle and rounds_n_under_drop:
        limit = n
    else:
        limit = n - (lookahead if lookahead > 1 else 1)
    limit = limit // unit * unit
    if eagle:
        limit -= unit
    return tmax(limit, 0)
