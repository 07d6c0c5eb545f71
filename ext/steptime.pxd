# Step-time models: the seconds one engine step takes, from what it scheduled.
# cimported by engine, which prices every batch inside its nogil loop.
from aisim._core.scheduler cimport BatchC
from aisim._core.types cimport int32_t, sec_t, tok_t

cdef enum TimeKind:
    TM_LINEAR = 0      # base_s + per_token_s * tokens + per_req_s * requests
    TM_ROOFLINE = 1    # operators each at their roofline, plus CPU and fixed costs, from GPU and model specs
    TM_TABLE = 2       # interpolated in a profile of measured forward passes

cdef enum TableAxis:
    AX_BATCH = 0       # scheduled requests
    AX_PREFILL = 1     # scheduled tokens that are not single-token decodes (verified drafts included)
    AX_KV = 2          # KV tokens read: the scheduled requests' contexts

cdef struct TimeModelC:
    int32_t kind                    # TimeKind
    # linear
    sec_t base_s                    # seconds of every step
    sec_t per_token_s               # seconds per scheduled token
    sec_t per_req_s                 # seconds per scheduled request
    # roofline: each operator of a step priced by its own roofline (aisim/perf/roofline.py)
    int32_t n_gemms                 # matrix products of a forward pass (by kind, the LM head included)
    double* gemm_n                  # [n_gemms] output columns on one GPU
    double* gemm_k                  # [n_gemms] depth on one GPU
    double* gemm_count              # [n_gemms] layers that run it
    int32_t* gemm_per_req           # [n_gemms] 1: M is the step's requests (LM head); 0: its tokens (padded)
    double* gemm_walk_s             # [n_gemms] block-FP8 kernel: seconds a wave of tiles walks K (0: roofline only)
    double* gemm_walk_factor        # [n_gemms] share of the kernel a grid under one wave takes (Stream-K), else 1
    double walk_fixed_s             # the block-FP8 kernel's fixed seconds, once a product
    double quant_s_per_token        # vLLM 0.8's Triton activation quantization, seconds per token (padded)
    double sms                      # the GPU's streaming multiprocessors: tiles run in waves of this many
    double tile                     # rows and columns of one output tile
    double act_bytes                # bytes of an activation element
    double weight_elt               # bytes of a weight element
    double flops_rate               # achievable matmul FLOP/s x compute efficiency
    double bytes_rate               # HBM bytes/s x bandwidth efficiency
    double attn_rate                # FLOP/s of attention (the KV cache's dtype) x attention efficiency
    int32_t n_terms                 # attention / KV terms, one per layer kind
    double* attn_flops              # [n_terms] FLOPs per (new token, context token) pair
    double* kv_bytes                # [n_terms] KV bytes read per context token
    tok_t* window                   # [n_terms] context cap (sliding window); 0 = none
    # MLA's two forms: a request of more than decode_max_tokens new tokens (not a decode) runs in the prefill form
    bint two_forms                  # the prefill form costs otherwise (MLA); else every request in the one form
    tok_t decode_max_tokens         # the MLA backend's decode threshold (vLLM's reorder_batch_threshold)
    double* attn_flops_prefill      # [n_terms] FLOPs per pair of a prefill-form request (multi-head over up-projected K, V)
    double ctx_flops                # matmul FLOPs per cached context token of a prefill-form request (its up-projection)
    double state_bytes              # recurrent state bytes read and written per scheduled request
    double state_flops              # recurrent update FLOPs per scheduled token
    double sample_bytes             # sampler bytes per scheduled request (float32 logits, several passes)
    double expert_flops_per_token   # routed experts' FLOPs per token (0: no routed experts)
    double expert_rate              # FLOP/s of vLLM's fused-MoE kernel at the experts' shape
    double expert_bytes_rate        # bytes/s the fused-MoE kernel reads the touched experts at
    double moe_experts              # routed experts per MoE layer, E (0: no routed experts)
    double moe_log_miss             # log(1 - k / E): log of one token's chance to skip a given expert
    double moe_expert_bytes         # bytes of one routed expert over every MoE layer, per GPU
    sec_t comm_s                    # tensor-parallel all-reduces: their fixed seconds per step
    sec_t comm_per_token_s          # ... and their seconds per token (padded)
    sec_t gpu_fixed_s               # the GPU's fixed seconds per step (per decoder layer x layers)
    sec_t overhead_s                # the CPU's seconds per step
    sec_t req_s                     # the CPU's seconds per scheduled request
    bint async_cpu                  # async scheduling: the CPU's time overlaps the GPU's (max), else adds
    int32_t n_graphs                # CUDA-graph capture sizes (0: none)
    tok_t* graph_sizes              # [n_graphs] ascending: token-keyed graphs (every step, or mixed ones)
    int32_t n_decode_graphs         # uniform decode graphs (0: decodes pad among graph_sizes)
    tok_t* decode_graph_sizes       # [n_decode_graphs] ascending, in tokens (requests x decode_q)
    tok_t decode_q                  # tokens of each request of a uniform decode
    # the matrix products' seconds of the last step priced (_gemms_time): a function of the padded
    # tokens and the requests alone, the same in every step of a quiet stretch of decoding
    bint gemm_memo                  # gemm_memo_s holds the products of gemm_memo_m rows, gemm_memo_reqs requests
    double gemm_memo_m
    double gemm_memo_reqs
    double gemm_memo_s
    # table
    int32_t n_axes                  # 1 (linear) or 2 (bilinear)
    int32_t axis[2]                 # TableAxis of each axis
    int32_t n_x                     # grid points on axis 0
    int32_t n_y                     # grid points on axis 1 (1 with one axis)
    double* xs                      # [n_x] increasing
    double* ys                      # [n_y] increasing
    double* latency                 # [n_x * n_y] seconds, x-major
    # speculative decoding: the drafter's own time, added to every step that samples a token
    bint drafter                    # a drafter cost is configured
    double drafter_fraction         # of the target step's time
    sec_t drafter_base_s            # or a linear model of its own: seconds per step
    sec_t drafter_per_token_s       # ... plus seconds per scheduled token
    sec_t scale                     # every step time multiplied by this (time_model.time_scale; 1.0)
    # the first step priced outside the table (reported by the engine)
    bint out_of_range               # a step fell outside the table's measured range
    double bad_x                    # its value on axis 0
    double bad_y                    # its value on axis 1

cdef sec_t tm_step_time(TimeModelC* tm, const BatchC* b) noexcept nogil
cdef list tm_load(TimeModelC* tm, dict m)
