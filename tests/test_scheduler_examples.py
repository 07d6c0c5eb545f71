"""The worked examples of the scheduler spec (section 12) with their exact numbers.

12.A are vLLM 0.31's own scheduler tests; 12.B were recorded from the real
0.31.0 Scheduler.  Each test names its example.
"""

from helpers import run_log


def _sched(steps, k):
    return steps[k]["sched"]


def test_concurrent_partial_requests():
    # 12.A.3 test_schedule_concurrent_partial_requests
    eng = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=1024,
               long_prefill_token_threshold=400, enable_prefix_caching=False)
    reqs = [dict(id=f"r{i}", prompt=800, max_tokens=16, at=0) for i in range(3)]
    steps, _, _ = run_log(eng, reqs)
    assert _sched(steps, 0) == {"r0": 400, "r1": 400, "r2": 224}
    assert _sched(steps, 1) == {"r0": 400, "r1": 400, "r2": 224}
    assert _sched(steps, 2) == {"r0": 1, "r1": 1, "r2": 352}


def test_long_prefill_threshold_ignored_when_alone():
    # 12.A.4: one eligible request -> the threshold is off.
    eng = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=4096,
               long_prefill_token_threshold=400, enable_prefix_caching=False)
    steps, _, _ = run_log(eng, [dict(id="a", prompt=2000, max_tokens=16, at=0)])
    assert _sched(steps, 0) == {"a": 1024}


def test_long_prefill_threshold_applies_with_other_requests():
    # 12.A.5
    eng = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=4096,
               long_prefill_token_threshold=400, enable_prefix_caching=False)
    reqs = [dict(id="a", prompt=2000, max_tokens=16, at=0), dict(id="b", prompt=10, max_tokens=16, at=0)]
    steps, _, _ = run_log(eng, reqs)
    assert _sched(steps, 0) == {"a": 400, "b": 10}


def test_long_prefill_threshold_floored_by_fair_share():
    # 12.A.6: adaptive floor max(100, 1024 // 2) = 512
    eng = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=4096,
               long_prefill_token_threshold=100, long_prefill_token_threshold_adaptive=True,
               enable_prefix_caching=False)
    reqs = [dict(id="a", prompt=2000, max_tokens=16, at=0), dict(id="b", prompt=10, max_tokens=16, at=0)]
    steps, _, _ = run_log(eng, reqs)
    assert _sched(steps, 0) == {"a": 512, "b": 10}


def test_schedule_order_chunked_on_and_off():
    # 12.A.7 test_schedule_order
    reqs = [dict(id="r0", prompt=800, max_tokens=16, at=0), dict(id="r1", prompt=800, max_tokens=16, at=0),
            dict(id="r2", prompt=10, max_tokens=16, at=0), dict(id="r3", prompt=10, max_tokens=16, at=0)]
    base = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=1024, max_num_seqs=3, max_model_len=1024,
                enable_prefix_caching=False)
    steps, _, _ = run_log(dict(base, enable_chunked_prefill=True), reqs)
    assert _sched(steps, 0) == {"r0": 800, "r1": 224}
    steps, _, _ = run_log(dict(base, enable_chunked_prefill=False), reqs)
    assert _sched(steps, 0) == {"r0": 800}  # r1 does not fit and stops the scan


def test_priority_ordering():
    # 12.A.9 test_priority_scheduling_basic_ordering, arrival tie-breaker, mixed, fcfs fallback.
    # A high-priority blocker holds the only running slot while the others arrive
    # at distinct times; afterwards they are admitted one at a time in heap order.
    eng = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=4096,
               policy="priority", enable_prefix_caching=False, time_model={"base_s": 0.01})
    cases = [([2, 0, 1], [1, 2, 3], ["1", "2", "0"]),
             ([1, 1, 1], [3, 1, 2], ["1", "2", "0"]),
             ([2, 1, 1, 0], [1, 3, 2, 4], ["3", "2", "1", "0"]),
             ([1, 1, 1, 1], [4, 1, 3, 2], ["1", "3", "2", "0"])]
    for prios, arrivals, order in cases:
        reqs = [dict(id="x", prompt=10, max_tokens=20, at=0.0, priority=-1)]
        reqs += sorted((dict(id=str(i), prompt=10, max_tokens=1, at=arrivals[i] * 0.001, priority=p)
                        for i, p in enumerate(prios)), key=lambda r: r["at"])
        steps, _, _ = run_log(eng, reqs, clock="time")
        admitted = [rid for k in sorted(steps) for rid in steps[k]["new"]]
        assert admitted == ["x"] + order


def test_priority_limited_slots():
    # 12.A.10: max_num_seqs 2, priorities [3, 1, 2, 0] all waiting -> "3", "1" admitted first.
    eng = dict(block_size=16, num_gpu_blocks=10000, max_num_batched_tokens=8192, max_num_seqs=2, max_model_len=4096,
               policy="priority", enable_prefix_caching=False)
    reqs = [dict(id=str(i), prompt=10, max_tokens=4, at=0, priority=p) for i, p in enumerate([3, 1, 2, 0])]
    steps, _, _ = run_log(eng, reqs)
    assert steps[0]["new"] == {"3": 0, "1": 0}
    assert steps[0]["waiting"] == 2


def test_full_isl_admission_s1():
    # max_model_len 160: what 10 usable blocks of 16 tokens hold (vLLM's start-up check).
    # 12.B S1: b is not admitted until the whole 100-token prompt fits.
    eng = dict(block_size=16, num_gpu_blocks=11, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=160,
               enable_prefix_caching=False)
    reqs = [dict(id="a", prompt=100, max_tokens=2, at=0), dict(id="b", prompt=100, max_tokens=2, at=0)]
    steps, _, _ = run_log(eng, reqs)
    assert [_sched(steps, k) for k in range(6)] == [
        {"a": 64}, {"a": 36}, {"a": 1}, {"b": 64}, {"b": 36}, {"b": 1}]
    assert [steps[k]["free_blocks"] for k in range(6)] == [6, 3, 10, 6, 3, 10]
    assert [steps[k]["waiting"] for k in range(3)] == [1, 1, 1]


def test_without_full_isl_s1b():
    # 12.B S1b: scheduler_reserve_full_isl off -> b admitted early, then preempts itself.
    eng = dict(block_size=16, num_gpu_blocks=11, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=160,
               enable_prefix_caching=False, scheduler_reserve_full_isl=False)
    reqs = [dict(id="a", prompt=100, max_tokens=2, at=0), dict(id="b", prompt=100, max_tokens=2, at=0)]
    steps, _, _ = run_log(eng, reqs)
    assert _sched(steps, 1) == {"a": 36, "b": 28}
    assert steps[1]["free_blocks"] == 1
    assert _sched(steps, 2) == {"a": 1}
    assert steps[2]["preempted"] == ["b"]
    assert [_sched(steps, k) for k in (3, 4, 5)] == [{"b": 64}, {"b": 36}, {"b": 1}]


def test_prefix_hits_s2():
    # 12.B S2: every prompt is the same token stream; hits are capped at num_tokens - 1.
    eng = dict(block_size=16, num_gpu_blocks=100, max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512)
    same = lambda n: [("ones", 0, n)]  # noqa: E731
    reqs = [dict(id="p0", prompt=64, max_tokens=2, at=0, segments=same(64)),
            dict(id="p1", prompt=64, max_tokens=2, at=3, segments=same(64)),
            dict(id="p2", prompt=70, max_tokens=2, at=6, segments=same(70)),
            dict(id="p3", prompt=64, max_tokens=2, at=9, segments=same(64)),
            dict(id="p4", prompt=64, max_tokens=2, at=9, segments=same(64))]
    steps, summary, result = run_log(eng, reqs)
    assert _sched(steps, 0) == {"p0": 64}
    assert _sched(steps, 3) == {"p1": 16}
    assert _sched(steps, 6) == {"p2": 6}
    assert _sched(steps, 9) == {"p3": 16, "p4": 16}
    st = result.steps.to_pydict()
    by_step = {s: (q, h, n) for s, q, h, n in zip(st["step"], st["prefix_queries"], st["prefix_hits"], st["num_new"])}
    assert by_step[0] == (64, 0, 1)
    assert by_step[3] == (64, 48, 1)
    assert by_step[6] == (70, 64, 1)
    assert by_step[9] == (128, 96, 2)


def _s3(caching):
    eng = dict(block_size=16, num_gpu_blocks=11, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=160,
               enable_prefix_caching=caching)
    reqs = [dict(id=f"r{i}", prompt=p, max_tokens=20, at=0) for i, p in enumerate((40, 40, 30, 20))]
    return run_log(eng, reqs)


def test_preemption_cascade_s3():
    # 12.B S3, identical with caching on and off except the resume step.
    for caching in (False, True):
        steps, summary, result = _s3(caching)
        assert _sched(steps, 0) == {"r0": 40, "r1": 24}
        assert _sched(steps, 1) == {"r0": 1, "r1": 16, "r2": 30, "r3": 17}
        assert steps[1]["free_blocks"] == 0
        assert _sched(steps, 2) == {"r0": 1, "r1": 1, "r2": 1, "r3": 3}
        assert _sched(steps, 4) == {"r0": 1, "r1": 1, "r2": 1} and steps[4]["preempted"] == ["r3"]
        assert _sched(steps, 10) == {"r0": 1, "r1": 1} and steps[10]["preempted"] == ["r2"]
        assert steps[10]["waiting"] == 2
        assert _sched(steps, 19) == {"r0": 1, "r1": 1} and steps[19]["finished"] == ["r0"]
        resume = {"r1": 1, "r2": 7 if caching else 39, "r3": 22}
        assert _sched(steps, 20) == resume
        if caching:
            st = result.steps.to_pydict()
            i = st["step"].index(20)
            assert (st["num_resumed"][i], st["preempted_prefix_queries"][i], st["preempted_prefix_hits"][i]) == (2, 61, 32)
            assert st["num_new"][0] == 2 and st["prefix_queries"][0] == 80  # both first admissions counted


def test_async_interleave():
    # 12.B async S/U interleave, batch queue of two.
    eng = dict(block_size=16, num_gpu_blocks=1000, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=512,
               async_scheduling=True)
    reqs = [dict(id="a", prompt=40, max_tokens=3, at=0), dict(id="b", prompt=100, max_tokens=2, at=0)]
    steps, summary, result = run_log(eng, reqs)
    scheds = [steps[k]["sched"] for k in sorted(steps)]
    assert scheds[:5] == [{"a": 40, "b": 24}, {"a": 1, "b": 63}, {"a": 1, "b": 13}, {"b": 1}, {}]
    assert [steps[k]["updated_step"] for k in sorted(steps)][:3] == [None, 0, 1]
    outputs = dict(zip(result.requests.column("request_id").to_pylist(),
                       result.requests.column("output_tokens").to_pylist()))
    assert outputs == {"a": 3, "b": 2}


def test_e13_preemption_and_readmission():
    # KV-cache spec E-13, 9 blocks: C is preempted at step 8 and readmitted at step 30 with a 32-token hit.
    eng = dict(block_size=16, num_gpu_blocks=9, max_num_batched_tokens=64, max_num_seqs=16, max_model_len=128)
    shared = ("shared", 0, 32)
    reqs = [dict(id="A", prompt=42, max_tokens=30, at=0, segments=[shared, ("a", 32, 10)]),
            dict(id="B", prompt=42, max_tokens=30, at=1, segments=[shared, ("b", 32, 10)]),
            dict(id="C", prompt=72, max_tokens=10, at=1, segments=[shared, ("c", 32, 40)])]
    steps, summary, result = run_log(eng, reqs)
    assert _sched(steps, 0) == {"A": 42} and steps[0]["free_blocks"] == 5
    assert _sched(steps, 1) == {"A": 1, "B": 10, "C": 40} and steps[1]["free_blocks"] == 1
    assert steps[1]["new"] == {"B": 32, "C": 32}
    assert steps[8]["preempted"] == ["C"] and steps[8]["free_blocks"] == 2
    for k in range(9, 30):
        assert "C" not in steps[k]["sched"]
    assert steps[30]["resumed"] == {"C": 32} and steps[30]["sched"]["C"] == 47
    assert steps[33]["free_blocks"] == 8 and steps[33]["running"] == 0
    st = result.steps.to_pydict()
    assert (st["prefix_queries"][0], st["prefix_hits"][0]) == (42, 0)
    assert (st["num_new"][1], st["prefix_queries"][1], st["prefix_hits"][1]) == (2, 114, 64)
    i = st["step"].index(30)
    assert (st["num_resumed"][i], st["preempted_prefix_queries"][i], st["preempted_prefix_hits"][i]) == (1, 79, 32)
    # With 11 blocks there is no preemption.
    steps, summary, _ = run_log(dict(eng, num_gpu_blocks=11), reqs)
    assert summary["preemptions"] == 0
