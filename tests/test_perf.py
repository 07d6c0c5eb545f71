"""Step-time models against hand-computed step times."""

import pytest

from aisim.errors import ConfigError, ReplayError

from helpers import run_log


def _durations(result):
    st = result.steps.to_pydict()
    return dict(zip(st["step"], st["duration_s"]))


def test_linear_model():
    eng = dict(num_gpu_blocks=200, max_model_len=4096,
               time_model={"base_s": 0.005, "per_token_s": 2e-5, "per_req_s": 1e-4})
    _, _, res = run_log(eng, [dict(id="a", prompt=100, max_tokens=2, at=0)])
    d = _durations(res)
    assert d[0] == pytest.approx(0.005 + 2e-5 * 100 + 1e-4)
    assert d[1] == pytest.approx(0.005 + 2e-5 * 1 + 1e-4)


def test_roofline_prefill_is_compute_bound_and_decode_memory_bound():
    # llama-3.1-8b on one H100 (989 TFLOP/s x 0.6, 3.35 TB/s x 0.8), overhead 2 ms.
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model={"kind": "roofline", "gpu": "H100", "model": "llama-3.1-8b"})
    _, _, res = run_log(eng, [dict(id="a", prompt=1000, max_tokens=2, at=0)])
    d = _durations(res)
    flops_rate, bytes_rate = 989e12 * 0.6, 3.35e12 * 0.8
    weights = 8.03e9 * 2                          # bf16 weights, read once a step
    attn = 4 * 32 * 128 * 32                      # FLOPs per (new, context) token pair, 32 layers
    kv_per_token = 2 * 8 * 128 * 2 * 32           # K and V, 8 KV heads x 128, bf16, 32 layers
    # Step 0: 1,000 prompt tokens, context 1,000.
    compute = (2 * 8.03e9 * 1000 + attn * 1000 * 1000) / flops_rate
    memory = (weights + kv_per_token * 1000) / bytes_rate
    assert compute > memory
    assert d[0] == pytest.approx(0.002 + compute, rel=1e-12)
    # Step 1: one decode token, context 1,001.
    compute = (2 * 8.03e9 + attn * 1001) / flops_rate
    memory = (weights + kv_per_token * 1001) / bytes_rate
    assert memory > compute
    assert d[1] == pytest.approx(0.002 + memory, rel=1e-12)


def test_roofline_window_caps_attention_reads():
    # gemma-3-27b: 52 sliding-window layers read at most 1,024 tokens.
    eng = dict(num_gpu_blocks=4000, max_model_len=8192, max_num_batched_tokens=8192,
               time_model={"kind": "roofline", "gpu": "H100", "model": "gemma-3-27b"})
    _, _, res = run_log(eng, [dict(id="a", prompt=4000, max_tokens=2, at=0)])
    d = _durations(res)
    bytes_rate = 3.35e12 * 0.8
    per_layer = 2 * 16 * 128 * 2
    memory = (27.4e9 * 2 + per_layer * 52 * 1024 + per_layer * 10 * 4001) / bytes_rate
    assert d[1] == pytest.approx(0.002 + memory, rel=1e-12)


def _profile(tmp_path, rows, header="prefill_tokens,kv_tokens,latency_s"):
    path = tmp_path / "profile.csv"
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return str(path)


def test_table_bilinear(tmp_path):
    # Grid over prefill tokens {0, 1000} x KV tokens read {0, 2000}.
    path = _profile(tmp_path, [(0, 0, 0.010), (0, 2000, 0.014), (1000, 0, 0.050), (1000, 2000, 0.070)])
    eng = dict(num_gpu_blocks=200, max_model_len=2000, max_num_batched_tokens=2048,
               time_model={"kind": "table", "path": path})
    _, _, res = run_log(eng, [dict(id="a", prompt=500, max_tokens=2, at=0)])
    d = _durations(res)
    # Step 0: prefill 500, KV read 500: x = 0.5, y = 0.25.
    lo = 0.010 + 0.5 * (0.050 - 0.010)
    hi = 0.014 + 0.5 * (0.070 - 0.014)
    assert d[0] == pytest.approx(lo + 0.25 * (hi - lo))
    # Step 1: a decode (no prefill tokens), KV read 501: x = 0, y = 0.2505.
    assert d[1] == pytest.approx(0.010 + 0.2505 * (0.014 - 0.010))


def test_table_linear_in_one_axis(tmp_path):
    path = _profile(tmp_path, [(1, 0.01), (4, 0.02)], header="batch_size,latency_s")
    eng = dict(num_gpu_blocks=200, max_model_len=2000, time_model={"kind": "table", "path": path})
    reqs = [dict(id=f"r{i}", prompt=10, max_tokens=3, at=0) for i in range(3)]
    _, _, res = run_log(eng, reqs)
    assert _durations(res)[0] == pytest.approx(0.01 + (3 - 1) / 3 * 0.01)


def test_table_never_extrapolates(tmp_path):
    path = _profile(tmp_path, [(0, 0, 0.01), (0, 100, 0.02), (100, 0, 0.03), (100, 100, 0.04)])
    eng = dict(num_gpu_blocks=200, max_model_len=2000, time_model={"kind": "table", "path": path})
    with pytest.raises(ReplayError, match="outside the step-time profile's measured range"):
        run_log(eng, [dict(id="a", prompt=500, max_tokens=2, at=0)])


def test_bad_profiles_are_named(tmp_path):
    with pytest.raises(ConfigError, match="full grid"):
        eng = dict(num_gpu_blocks=200, time_model={"kind": "table",
                                                   "path": _profile(tmp_path, [(0, 0, 0.01), (1, 1, 0.02)])})
        run_log(eng, [dict(id="a", prompt=5, max_tokens=1, at=0)])
    with pytest.raises(ConfigError, match="'time_model.gpu' is required"):
        run_log(dict(num_gpu_blocks=200, time_model={"kind": "roofline", "model": "llama-3.1-8b"}), [])


@pytest.mark.parametrize("data,fragment", [
    (b"prefill_tokens,latency_s\n0,0.01\n64,nan\n", ":3: field 'latency_s' must be a finite number, got 'nan'"),
    (b"prefill_tokens,latency_s\n0,0.01\n6\xff,0.02\n", ":3: not UTF-8 text (byte 0xff at column 2)"),
])
def test_profile_tables_refuse_non_finite_numbers_and_bytes_that_are_not_utf8(tmp_path, data, fragment):
    from aisim.perf.table import table_args

    path = tmp_path / "profile.csv"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        table_args(str(path))
    assert str(err.value) == f"{path}{fragment}"


def test_table_counts_verified_drafts_as_prefill_tokens(tmp_path):
    # Same grid.  With k = 3 drafts, step 1 verifies 1 + 3 tokens: the 3 drafts are a multi-token query
    # (prefill axis 3), the context read is 500 + 4 = 504: x = 0.003, y = 0.252.
    path = _profile(tmp_path, [(0, 0, 0.010), (0, 2000, 0.014), (1000, 0, 0.050), (1000, 2000, 0.070)])
    eng = dict(num_gpu_blocks=200, max_model_len=2000, max_num_batched_tokens=2048,
               time_model={"kind": "table", "path": path},
               speculative={"num_speculative_tokens": 3, "acceptance": {"counts": [0]}})
    _, _, res = run_log(eng, [dict(id="a", prompt=500, max_tokens=2, at=0)])
    lo = 0.010 + 0.003 * (0.050 - 0.010)
    hi = 0.014 + 0.003 * (0.070 - 0.014)
    assert _durations(res)[1] == pytest.approx(lo + 0.252 * (hi - lo))
