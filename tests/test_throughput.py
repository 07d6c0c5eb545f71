"""One throughput definition, vllm bench serve's (aisim.throughput): completed requests and their output
tokens over the time from the first send to the last response, whoever reports it."""

import numpy as np
import pytest

from aisim.bench_metrics import bench_metrics
from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay
from aisim.throughput import Span, benchmark_duration, per_second

from helpers import make_trace


def test_benchmark_duration_and_rates_by_hand():
    span = Span()
    span.add([2.0, np.nan, 1.5], [np.nan, np.nan, 3.0])
    span.add([4.0], [9.5])          # a later piece: the last response moves, the start stays
    assert (span.start, span.last) == (1.5, 9.5)
    assert span.duration(3) == 8.0 and span.duration(3, start=0.0) == 9.5
    assert span.duration(0) == 0.0 and benchmark_duration(np.nan, 0.0, 2) == 0.0
    assert per_second(20, 8.0) == 2.5 and per_second(5, 0.0) is None


def _run():
    # Linear steps of 10 ms, no API server: request a (sent at 1.0 s) prefills in 1.00-1.01 and decodes
    # twice, finishing at 1.03; b (sent at 1.5 s) finishes at 1.53; c's prompt is longer than
    # max_model_len, refused by the server (failed, no tokens).
    eng = engine_config_from_dict(dict(num_gpu_blocks=64, block_size=16, max_model_len=256,
                                       max_num_batched_tokens=256, async_scheduling=False,
                                       time_model=dict(kind="linear", base_s=0.01, frontend=False)))
    trace = make_trace([dict(id="a", prompt=10, max_tokens=3, at=1.0), dict(id="b", prompt=10, max_tokens=3, at=1.5),
                        dict(id="c", prompt=300, max_tokens=3, at=1.2)], clock="time")
    return replay(trace, eng, reject_too_long=True)


def test_summary_and_bench_record_agree_by_hand():
    res = _run()
    s, rec = res.summary, bench_metrics(res.requests)
    fin = dict(zip(res.requests.column("request_id").to_pylist(), res.requests.column("finish_s").to_pylist()))
    assert fin["a"] == pytest.approx(1.03) and fin["b"] == pytest.approx(1.53)
    # From the first send (1.0 s) to the last response (1.53 s); two completed, six output tokens.
    assert s["duration_s"] == rec["duration"] == pytest.approx(0.53)
    assert s["throughput_req_s"] == rec["request_throughput"] == pytest.approx(2 / 0.53)
    assert s["throughput_tok_s"] == rec["output_throughput"] == pytest.approx(6 / 0.53)
    assert (rec["completed"], rec["failed"]) == (2, 1)
