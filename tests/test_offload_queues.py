"""Which waiting queue an offload request sits in, under --max-num-inflight-kv-loads (vLLM 0.34.0).

vllm/v1/core/sched/scheduler.py keeps requests that "may load KV async" in a queue of their own
(``async_kv_waiting``, _enqueue_waiting_request) so that their loads can start while the batch is
full and other requests go on past one whose load is over the cap.  Whether a request goes there is
the connector's ``may_load_async``: the base class answers the P/D ``do_remote_prefill`` flag and
the OffloadingConnector does not override it, so a request with a CPU-tier hit waits in ``waiting``
like any other.  A load over the cap then stops the waiting pass (``break``: the request "waits at
the head of its queue"), and nothing behind it is admitted.
"""

from helpers import run_log
from test_kv_offload import _engine, _req


def _trace():
    return [_req("A1", 0, 32, "p1", 32), _req("A2", 0, 32, "p2", 32), _req("B", 5, 159),
            _req("C1", 10, 48, "p1", 32), _req("C2", 10, 48, "p2", 32), _req("D", 10, 16)]


def test_a_load_over_the_cap_holds_back_the_requests_behind_it():
    # tests/test_kv_offload.py's case with D (16 tokens of its own, no hit) queued behind C2.  Step
    # 10: C1 starts its load (job 3); C2's hit would be a second load in flight: the pass stops at
    # C2, and D is not even looked up.  Step 11: C1 still waits for its load (reported by this
    # step's output); C2 stops the pass again.  Step 12: C1 runs, C2's load starts (job 4) and D,
    # found in neither cache, runs too.
    steps, _, _ = run_log(_engine(11, cpu_blocks=30, max_num_inflight_kv_loads=1), _trace())
    off = {k: steps[k]["offload"] for k in steps}
    assert off[10]["lookups"] == {"C1": [0, 32], "C2": [0, 32]} and steps[10]["sched"] == {}
    assert off[11]["lookups"] == {"C2": [0, 32]} and steps[11]["sched"] == {}
    assert off[12]["lookups"] == {"C2": [0, 32], "D": [0, 0]} and off[12]["loads"] == {"4": ["C2", 32, 2]}
    assert steps[12]["new"] == {"C1": 32, "D": 0} and steps[12]["sched"] == {"C1": 16, "D": 16}
    assert steps[14]["new"] == {"C2": 32}
    # Without the cap D runs in step 10, beside both loads.
    steps, _, _ = run_log(_engine(11, cpu_blocks=30), _trace())
    assert steps[10]["new"] == {"D": 0} and list(steps[10]["offload"]["loads"]) == ["3", "4"]
