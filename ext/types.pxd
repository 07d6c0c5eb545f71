# Every C type name of the replay core, fixed in width and named for its meaning.
# cimported by every other module of ext/; nothing else writes raw C integer types.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t

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
