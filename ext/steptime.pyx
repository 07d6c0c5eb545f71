"""Step-time models evaluated inside the replay loop, without Python calls.

* linear: ``base_s + per_token_s * tokens + per_req_s * requests``, left to
  right (the oracle recorder's formula);
* roofline: the step's operators each at their own roofline
  (``aisim/perf/roofline.py`` states the model): every GEMM kind ``max(tiles in
  waves x tile FLOPs / rate, (weights + activations) / bandwidth)`` (a block-FP8
  product on Hopper: or its waves' walk down ``K``, if longer) times the
  layers that run it, ``M`` the step's tokens padded to its CUDA graph (the LM
  head's the requests); the routed experts; attention in a prefill and a decode
  kernel; vLLM 0.8's Triton quantization of a block-FP8 model's activations;
  recurrent states; the sampler; the all-reduces; a fixed GPU cost; then
  the CPU's step and per-request seconds, overlapped (async scheduling) or
  added.  MLA runs a request in one of two forms, as vLLM's MLA metadata
  builder splits the batch: a request of more than ``decode_max_tokens`` new
  tokens that is not a decode is priced at ``attn_flops_prefill`` a pair plus
  ``ctx_flops`` matmul FLOPs per token of its cached context, every other at
  ``attn_flops`` (models without MLA: one form, the same arithmetic);
* table: linear (one axis) or bilinear (two axes) interpolation in a grid of
  measured forward passes over batch size, prefill tokens and KV tokens read.
  A step outside the measured range is never extrapolated: the model flags it
  and the engine stops with an error naming the values.

With speculative decoding the verified drafts are scheduled tokens: the
linear and roofline models charge them like any token, and the table model
counts them on its prefill axis (a verification is a multi-token query, not a
single-token decode).  The drafter's own time is added to every step that
samples a token: a fraction of the target step's time, or ``base_s +
per_token_s * scheduled tokens``.
"""

from libc.math cimport ceil, exp

import numpy as np

from aisim._core.scheduler cimport BatchC
from aisim._core.types cimport int32_t, sec_t, tok_t


cdef inline double _feature(const TimeModelC* tm, int32_t axis, double batch, double prefill,
                            double kv) noexcept nogil:
    if axis == AX_BATCH:
        return batch
    if axis == AX_PREFILL:
        return prefill
    return kv


cdef int32_t _cell(const double* grid, int32_t n, double v) noexcept nogil:
    # Index i with grid[i] <= v <= grid[i + 1] (binary search); -1 outside.
    cdef int32_t lo = 0, hi = n - 1, mid
    if n == 1:
        return 0 if v == grid[0] else -1
    if v < grid[0] or v > grid[n - 1]:
        return -1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if grid[mid] <= v:
            lo = mid
        else:
            hi = mid
    return lo


cdef sec_t _table(TimeModelC* tm, double batch, double prefill, double kv) noexcept nogil:
    cdef double x = _feature(tm, tm.axis[0], batch, prefill, kv)
    cdef double y = _feature(tm, tm.axis[1], batch, prefill, kv) if tm.n_axes == 2 else 0.0
    cdef int32_t i = _cell(tm.xs, tm.n_x, x)
    cdef int32_t j = 0
    cdef double tx, ty, a, b
    if tm.n_axes == 2:
        j = _cell(tm.ys, tm.n_y, y)
    if i < 0 or j < 0:
        if not tm.out_of_range:
            tm.out_of_range = True
            tm.bad_x = x
            tm.bad_y = y
        return 0.0
    if tm.n_x == 1:
        tx = 0.0
    else:
        tx = (x - tm.xs[i]) / (tm.xs[i + 1] - tm.xs[i])
    if tm.n_axes == 1:
        if tm.n_x == 1:
            return tm.latency[0]
        return tm.latency[i] + tx * (tm.latency[i + 1] - tm.latency[i])
    ty = 0.0 if tm.n_y == 1 else (y - tm.ys[j]) / (tm.ys[j + 1] - tm.ys[j])
    # Bilinear: along x on rows j and j + 1, then along y.
    a = tm.latency[i * tm.n_y + j]
    b = tm.latency[i * tm.n_y + j + 1] if tm.n_y > 1 else a
    if tm.n_x > 1:
        a = a + tx * (tm.latency[(i + 1) * tm.n_y + j] - a)
        if tm.n_y > 1:
            b = b + tx * (tm.latency[(i + 1) * tm.n_y + j + 1] - b)
    return a + ty * (b - a)


cdef sec_t _drafter(const TimeModelC* tm, const BatchC* b, sec_t target) noexcept nogil:
    # Drafting follows a step that samples a token (a step of prefill chunks only drafts nothing).
    cdef int32_t i
    for i in range(b.n):
        if b.sampled[i]:
            return (tm.drafter_fraction * target + tm.drafter_base_s
                    + tm.drafter_per_token_s * <sec_t>b.total_tokens)
    return 0.0


cdef sec_t tm_step_time(TimeModelC* tm, const BatchC* b) noexcept nogil:
    """Seconds batch ``b`` takes: the target's forward pass, plus the drafter's when configured,
    times the model's scale (1.0 unless a calibration band's end is replayed)."""
    cdef sec_t t = _target_time(tm, b)
    if tm.drafter:
        t += _drafter(tm, b, t)
    return t * tm.scale


cdef sec_t _target_time(TimeModelC* tm, const BatchC* b) noexcept nogil:
    """Seconds the forward pass of batch ``b`` takes."""
    cdef int32_t i, t
    cdef double prefill = 0.0, kv = 0.0, flops, bytes_, ctx, pairs
    if tm.kind == TM_LINEAR:
        return tm.base_s + tm.per_token_s * <sec_t>b.total_tokens + tm.per_req_s * <sec_t>b.n
    if tm.kind == TM_TABLE:
        if b.n == 0:
            return 0.0  # nothing ran: no forward pass to price
        for i in range(b.n):
            if not b.decode[i]:
                prefill += b.tokens[i]
            else:
                prefill += b.spec_m[i]  # verified drafts: a multi-token query
            kv += b.ctx[i]
        return _table(tm, b.n, prefill, kv)
    if b.n == 0:
        return tm.overhead_s   # nothing ran on the GPU: the CPU's step alone
    cdef double cpu = tm.overhead_s + tm.req_s * <double>b.n
    cdef double gpu = _gpu_time(tm, b)
    if tm.async_cpu:
        # vLLM's async scheduling (EngineCore.step_with_batch_queue) schedules the next step while
        # the GPU runs this one: the slower of the two sets the pace.
        return gpu if gpu > cpu else cpu
    return gpu + cpu


cdef double _smallest_holding(const tok_t* sizes, int32_t n, double tokens) noexcept nogil:
    """The smallest of ``sizes[0:n]`` (ascending) holding ``tokens``, or ``tokens`` past the largest."""
    cdef int32_t lo = 0, hi = n, mid
    if hi == 0 or tokens > sizes[hi - 1]:
        return tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if sizes[mid] < tokens:
            lo = mid + 1
        else:
            hi = mid
    return <double>sizes[lo]


cdef double _padded(const TimeModelC* tm, const BatchC* b) noexcept nogil:
    """Tokens the step's GEMMs run on: the smallest CUDA graph holding the step's tokens, or its
    tokens past the largest (aisim/perf/graphs.py).  Under the split rule (vLLM 0.34,
    CudaGraphManager.dispatch, vllm/v1/worker/gpu/cudagraph_utils.py) a uniform decode, every
    request ``decode_q`` tokens, first takes the decode graphs; else (CudagraphDispatcher.dispatch,
    vllm/v1/cudagraph_dispatcher.py) every step pads among the one list."""
    cdef double tokens = <double>b.total_tokens
    cdef int32_t i
    cdef bint uniform = tm.n_decode_graphs > 0 and b.n > 0 and tokens <= tm.decode_graph_sizes[tm.n_decode_graphs - 1]
    for i in range(b.n):
        if not uniform:
            break
        # GPUModelRunner.gather_batch_req_state: decode graphs only for a batch without prefill (a
        # request's first token is a prefill even when it is its only one).
        uniform = b.tokens[i] == tm.decode_q and b.decode[i] and b.ctx[i] > b.tokens[i]
    if uniform:
        return _smallest_holding(tm.decode_graph_sizes, tm.n_decode_graphs, tokens)
    return _smallest_holding(tm.graph_sizes, tm.n_graphs, tokens)


cdef double _gemm_time(const TimeModelC* tm, double m, double n, double k, double walk,
                       double factor) noexcept nogil:
    """Seconds of one ``m x k`` by ``k x n`` product: its tiles in waves over the SMs, or its bytes,
    or (``walk > 0``: vLLM's block-FP8 kernel, aisim/perf/block_fp8.py) each wave's walk down ``k``."""
    cdef double tiles = ceil(m / tm.tile) * ceil(n / tm.tile)
    cdef double waves = ceil(tiles / tm.sms)
    cdef double t
    if tiles > tm.sms:
        tiles = waves * tm.sms   # whole waves once the grid exceeds the GPU
    cdef double compute = tiles * 2.0 * tm.tile * tm.tile * k / tm.flops_rate
    cdef double memory = (n * k * tm.weight_elt + m * (k + n) * tm.act_bytes) / tm.bytes_rate
    if compute < memory:
        compute = memory
    if walk > 0.0:
        # cutlass_gemm_blockwise_sm90_fp8_dispatch: a persistent kernel set up once, each wave of tiles walking
        # the whole depth; a grid under one wave, under Stream-K, splits its depth over idle SMs (factor < 1).
        t = (tm.walk_fixed_s + walk) * factor if tiles < tm.sms else tm.walk_fixed_s + waves * walk
        if t > compute:
            return t
    return compute


cdef inline double _bound(double flops, double rate, double bytes_, double bw) noexcept nogil:
    cdef double c = flops / rate, m = bytes_ / bw
    return c if c > m else m


cdef double _gemms_time(TimeModelC* tm, double m, double reqs) noexcept nogil:
    """The GPU's fixed seconds plus every matrix product of a step of ``m`` padded tokens and ``reqs``
    requests, summed in one order whether computed or remembered (the last step's, kept in ``tm``)."""
    cdef int32_t g
    cdef double gpu
    if tm.gemm_memo and tm.gemm_memo_m == m and tm.gemm_memo_reqs == reqs:
        return tm.gemm_memo_s
    gpu = tm.gpu_fixed_s
    for g in range(tm.n_gemms):
        gpu += tm.gemm_count[g] * _gemm_time(tm, reqs if tm.gemm_per_req[g] else m, tm.gemm_n[g], tm.gemm_k[g],
                                             tm.gemm_walk_s[g], tm.gemm_walk_factor[g])
    tm.gemm_memo = True
    tm.gemm_memo_m = m
    tm.gemm_memo_reqs = reqs
    tm.gemm_memo_s = gpu
    return gpu


cdef double _gpu_time(TimeModelC* tm, const BatchC* b) noexcept nogil:
    """Seconds the GPU spends on batch ``b``: each operator at its roofline, one after another."""
    cdef int32_t i, t
    cdef double tokens = <double>b.total_tokens, reqs = <double>b.n
    cdef double m = _padded(tm, b)
    cdef double gpu = _gemms_time(tm, m, reqs), ctx, pairs, up = 0.0
    cdef double p_flops = 0.0, p_bytes = 0.0, d_flops = 0.0, d_bytes = 0.0
    cdef const double* af
    if tm.moe_experts > 0.0:
        # Routed experts the step reads: of E per layer, T tokens picking k each uniformly touch
        # E (1 - (1 - k/E)^T) distinct ones on average (the step's own tokens: a CUDA graph's padding
        # rows are alike and pick the same k); the kernel multiplies every row, padding included, and
        # reads the touched experts at its own measured rate (aisim/perf/moe_kernel.py READ_SHARE).
        gpu += _bound(tm.expert_flops_per_token * m, tm.expert_rate,
                      tm.moe_expert_bytes * tm.moe_experts * (1.0 - exp(tokens * tm.moe_log_miss)),
                      tm.expert_bytes_rate)
    for i in range(b.n):
        af = tm.attn_flops
        # vLLM's MLA metadata builder (MLACommonMetadataBuilder.build -> split_decodes_and_prefills,
        # vllm/model_executor/layers/attention/mla_attention.py) sends a request of more new tokens than
        # its reorder_batch_threshold to the prefill path (forward_mha); a decode verifying drafts stays
        # on the decode path, the threshold raised to 1 + drafts (_init_reorder_batch_threshold).
        if tm.two_forms and b.tokens[i] > tm.decode_max_tokens and not b.decode[i]:
            af = tm.attn_flops_prefill
            up += <double>(b.ctx[i] - b.tokens[i])   # its cached context, up-projected this step
        for t in range(tm.n_terms):
            ctx = <double>b.ctx[i]
            if tm.window[t] > 0 and ctx > tm.window[t]:
                ctx = <double>tm.window[t]
            pairs = _pairs(<double>b.tokens[i], <double>b.ctx[i], <double>tm.window[t])
            # Prefill chunks and decodes run as two attention kernels (FlashAttention's varlen
            # prefill, the paged decode); each reads every context token's K and V once.
            if b.decode[i]:
                d_flops += af[t] * pairs
                d_bytes += tm.kv_bytes[t] * ctx
            else:
                p_flops += af[t] * pairs
                p_bytes += tm.kv_bytes[t] * ctx
    gpu += _bound(p_flops, tm.attn_rate, p_bytes, tm.bytes_rate) + _bound(d_flops, tm.attn_rate, d_bytes, tm.bytes_rate)
    if tm.two_forms:
        # _compute_prefill_context: kv_b_proj over the cached latent of every prefill-form request.
        gpu += tm.ctx_flops * up / tm.flops_rate
    if tm.state_bytes > 0.0:
        gpu += _bound(tm.state_flops * tokens, tm.flops_rate, tm.state_bytes * reqs, tm.bytes_rate)
    gpu += tm.sample_bytes * reqs / tm.bytes_rate
    # per_token_group_quant_fp8 (fp8_utils.py) before each block-FP8 product: vLLM 0.8's Triton kernel, a program a
    # 128-wide group of the padded rows (aisim/perf/block_fp8.py QUANT_S_PER_ELEMENT); 0 otherwise.
    gpu += tm.quant_s_per_token * m
    return gpu + tm.comm_s + tm.comm_per_token_s * m


cdef inline double _pairs(double n, double c, double w) noexcept nogil:
    """(new token, key) pairs of ``n`` new tokens ending at context ``c`` under causal attention.

    The new tokens sit at positions ``c - n + 1 .. c`` (counting from 1) and each attends to
    ``min(position, w)`` keys; ``w = 0``: no window.  The sum in closed form.
    """
    cdef double a = c - n + 1.0
    if w <= 0.0 or c <= w:
        return (a + c) * n * 0.5
    if a >= w:
        return w * n
    return (a + w) * (w - a + 1.0) * 0.5 + w * (c - w)


# ------------------------------------------------------------------ loading a model

cdef list tm_load(TimeModelC* tm, dict m):
    """Load a roofline or table model (a plain dict from aisim.perf, validated there) into
    ``tm``; returns the arrays its pointers borrow, which the caller keeps alive."""
    cdef const double[::1] af, afp, kb, xs, ys, lat
    cdef const tok_t[::1] win, gs, dgs
    cdef const double[::1] gn, gk, gc, gw, gf
    cdef const int32_t[::1] gr
    tm.kind = m["kind"]
    tm.gemm_memo = False
    keep = []
    if m["kind"] == TM_ROOFLINE:
        af = np.ascontiguousarray(m["attn_flops"], dtype=np.float64)
        kb = np.ascontiguousarray(m["kv_bytes"], dtype=np.float64)
        win = np.ascontiguousarray(m["window"], dtype=np.int64)
        afp = np.ascontiguousarray(m["attn_flops_prefill"], dtype=np.float64)
        gn = np.ascontiguousarray(m["gemm_n"], dtype=np.float64)
        gk = np.ascontiguousarray(m["gemm_k"], dtype=np.float64)
        gc = np.ascontiguousarray(m["gemm_count"], dtype=np.float64)
        gr = np.ascontiguousarray(m["gemm_per_req"], dtype=np.int32)
        gw = np.ascontiguousarray(m["gemm_walk_s"], dtype=np.float64)
        gf = np.ascontiguousarray(m["gemm_walk_factor"], dtype=np.float64)
        gs = np.ascontiguousarray(m["graph_sizes"], dtype=np.int64)
        dgs = np.ascontiguousarray(m["decode_graph_sizes"], dtype=np.int64)
        keep += [af, afp, kb, win, gn, gk, gc, gr, gw, gf, gs, dgs]
        tm.n_terms = <int32_t>af.shape[0]
        tm.attn_flops = <double*>&af[0] if af.shape[0] else NULL
        tm.attn_flops_prefill = <double*>&afp[0] if afp.shape[0] else NULL
        tm.ctx_flops = m["ctx_flops"]
        tm.decode_max_tokens = m["decode_max_tokens"]
        # One form unless a term's prefill pairs cost otherwise or the context is up-projected.
        tm.two_forms = tm.ctx_flops != 0.0 or list(m["attn_flops_prefill"]) != list(m["attn_flops"])
        tm.kv_bytes = <double*>&kb[0] if kb.shape[0] else NULL
        tm.window = <tok_t*>&win[0] if win.shape[0] else NULL
        tm.n_gemms = <int32_t>gn.shape[0]
        tm.gemm_n = <double*>&gn[0] if gn.shape[0] else NULL
        tm.gemm_k = <double*>&gk[0] if gk.shape[0] else NULL
        tm.gemm_count = <double*>&gc[0] if gc.shape[0] else NULL
        tm.gemm_per_req = <int32_t*>&gr[0] if gr.shape[0] else NULL
        tm.gemm_walk_s = <double*>&gw[0] if gw.shape[0] else NULL
        tm.gemm_walk_factor = <double*>&gf[0] if gf.shape[0] else NULL
        tm.n_graphs = <int32_t>gs.shape[0]
        tm.graph_sizes = <tok_t*>&gs[0] if gs.shape[0] else NULL
        tm.n_decode_graphs = <int32_t>dgs.shape[0]
        tm.decode_graph_sizes = <tok_t*>&dgs[0] if dgs.shape[0] else NULL
        tm.decode_q = m["decode_q"]
        tm.sms = m["sms"]
        tm.walk_fixed_s = m["walk_fixed_s"]
        tm.quant_s_per_token = m["quant_s_per_token"]
        tm.tile = m["tile"]
        tm.act_bytes = m["act_bytes"]
        tm.weight_elt = m["weight_elt"]
        tm.flops_rate = m["flops_rate"]
        tm.bytes_rate = m["bytes_rate"]
        tm.attn_rate = m["attn_rate"]
        tm.state_bytes = m["state_bytes"]
        tm.state_flops = m["state_flops"]
        tm.sample_bytes = m["sample_bytes"]
        tm.expert_flops_per_token = m["expert_flops_per_token"]
        tm.expert_rate = m["expert_rate"]
        tm.expert_bytes_rate = m["expert_bytes_rate"]
        tm.moe_experts = m["moe_experts"]
        tm.moe_log_miss = m["moe_log_miss"]
        tm.moe_expert_bytes = m["moe_expert_bytes"]
        tm.comm_s = m["comm_s"]
        tm.comm_per_token_s = m["comm_per_token_s"]
        tm.gpu_fixed_s = m["gpu_fixed_s"]
        tm.overhead_s = m["overhead_s"]
        tm.req_s = m["req_s"]
        tm.async_cpu = m["async_cpu"]
    elif m["kind"] == TM_TABLE:
        xs = np.ascontiguousarray(m["xs"], dtype=np.float64)
        ys = np.ascontiguousarray(m["ys"], dtype=np.float64)
        lat = np.ascontiguousarray(m["latency"], dtype=np.float64)
        keep += [xs, ys, lat]
        tm.n_axes = len(m["axes"])
        tm.axis[0] = m["axes"][0]
        tm.axis[1] = m["axes"][1] if tm.n_axes == 2 else 0
        tm.n_x = <int32_t>xs.shape[0]
        tm.n_y = <int32_t>ys.shape[0]
        tm.xs = <double*>&xs[0]
        tm.ys = <double*>&ys[0]
        tm.latency = <double*>&lat[0]
    return keep
