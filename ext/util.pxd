# Small arithmetic and request helpers shared by the modules of ext/
# (kvcache, scheduler, engine and the group managers).  Inline: they sit in
# the hottest loops, and a cross-module call of a one-line function costs.
from aisim._core.request cimport ReqC
from aisim._core.types cimport tok_t


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


cdef inline tok_t ckpt_position(tok_t n, tok_t unit) noexcept nogil:
    # get_mamba_prefill_checkpoint_position without EAGLE: leave one token.
    return tmax((n - 1) // unit * unit, 0)
