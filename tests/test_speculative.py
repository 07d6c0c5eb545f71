"""Speculative decoding: the scheduler's draft rules with hand-derived numbers.

Each test states its arithmetic.  Engines are small (block size 16 unless
said otherwise) and the fake model accepts drafts by a rule the test picks
(``counts``, a request's ``accept`` list, the hash rule), so every number
below follows from vLLM's rules: ``num_tokens_with_spec`` in the running
pass, ``num_lookahead_tokens`` slots in ``allocate_slots``, the ``-1``
padding of a one-token admission, the rollback of rejected drafts in
``update_from_output``, and the releases' EAGLE prefix-cache rules.
"""

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.config.speculative import (
    HISTOGRAM_BITS, SpeculativeConfig, histogram_thresholds, parse_speculative, scheduler_view, splitmix64,
)
from aisim.errors import ConfigError

from helpers import run_log


def accepted(sp: SpeculativeConfig, i: int, n: int, m: int, accept=None) -> int:
    """Drafts accepted of ``m`` at request ``i``'s ``n``-th verification: the core's rule
    (ext/scheduler.pyx ``_accepted``) restated in Python, the reference the tests hold it to.

    Parameters
    ----------
    sp : SpeculativeConfig
    i, n, m : int
        Request index in the trace, earlier verifications, drafts verified.
    accept : list of int, optional
        The request's trace field ``accept``.

    Returns
    -------
    int
    """
    if accept:
        return min(m, accept[n % len(accept)])
    kind, values, seed = sp.rule()
    if kind == "counts":
        return min(m, values[n % len(values)])
    h = splitmix64(splitmix64(splitmix64(seed) ^ i) ^ n)
    if kind == "histogram":
        v, t = h >> (64 - HISTOGRAM_BITS), histogram_thresholds(values)
        a = 0
        while a < len(t) - 1 and v >= t[a]:
            a += 1
        return min(m, a)
    a = 0
    for j in range(m):
        if splitmix64(h ^ j) % 1000 >= values[min(j, len(values) - 1)]:
            break
        a += 1
    return a


def spec(k=3, method="eagle", **acceptance):
    return {"num_speculative_tokens": k, "method": method, "acceptance": acceptance or {"counts": [0]}}


def engine(**kw):
    base = dict(block_size=16, num_gpu_blocks=100, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    base.update(kw)
    return base


def lines(steps, key):
    return [s[key] for s in steps.values()]


# ---------------------------------------------------------------- token budget and lookahead slots


def test_running_requests_schedule_one_plus_drafts_within_the_budget():
    # Three 3-token prompts, k = 3, a 10-token budget, nothing accepted.  Step 0 admits 3 + 3 + 3.
    # Then each decoder schedules 1 + 3: a 4, b 4, and c the 2 left (1 + one draft).
    eng = engine(max_num_batched_tokens=10, enable_prefix_caching=False, speculative=spec(counts=[0]))
    steps, _, _ = run_log(eng, [dict(id=x, prompt=3, max_tokens=5, at=0) for x in "abc"])
    assert steps[0]["sched"] == {"a": 3, "b": 3, "c": 3} and steps[0]["spec"] == {}
    assert steps[1]["sched"] == {"a": 4, "b": 4, "c": 2}
    assert steps[1]["spec"] == {"a": [3, 0], "b": [3, 0], "c": [1, 0]}
    assert steps[1]["total_tokens"] == 10


def test_draft_model_takes_one_draft_slot_of_input_budget_per_request():
    # draft_model: max_num_new_slots_for_drafting = 1.  Step 0: a min(3, 10 - 1) = 3 (input 10 - 4 = 6),
    # b 3 (input 2), c min(budget 4, 2 - 1) = 1.  Step 1: a 4 (input 10 - 5 = 5), b min(4, 5 - 1) = 4
    # (input 0), then 0 <= 1 stops the pass: c gets nothing.
    eng = engine(max_num_batched_tokens=10, enable_prefix_caching=False, speculative=spec(method="draft_model"))
    steps, _, _ = run_log(eng, [dict(id=x, prompt=3, max_tokens=5, at=0) for x in "abc"])
    assert steps[0]["sched"] == {"a": 3, "b": 3, "c": 1}
    assert steps[1]["sched"] == {"a": 4, "b": 4}


@pytest.mark.parametrize("method, blocks", [("eagle", 2), ("mtp", 2), ("draft_model", 2), ("ngram", 1)])
def test_lookahead_slots_are_allocated(method, blocks):
    # A 14-token prompt: 14 slots fit one 16-token block; with k = 3 lookahead slots (EAGLE, MTP, draft
    # model) 17 need two.  n-gram drafting reserves no lookahead.  99 usable blocks.
    eng = engine(enable_prefix_caching=False, speculative=spec(method=method))
    steps, _, _ = run_log(eng, [dict(id="a", prompt=14, max_tokens=4, at=0)])
    assert steps[0]["free_blocks_sched"] == 99 - blocks


def test_rollback_after_partial_acceptance():
    # 16-token prompt, k = 3, one draft accepted per verification, max_tokens 9.  Step 0 prefills 16
    # (1 output).  Each later step schedules 1 + 3 = 4 and keeps 1 + 1 tokens; the 2 rejected drafts roll
    # num_computed_tokens back, so the next step again schedules exactly 4.  Outputs 1, 3, 5, 7, 9:
    # finished at step 4.  Step time 0.01 s: TPOT = (0.05 - 0.01) / 8 = 0.005 s, two tokens a step.
    eng = engine(speculative=spec(counts=[1]))
    steps, summary, result = run_log(eng, [dict(id="a", prompt=16, max_tokens=9, at=0)])
    assert lines(steps, "sched")[:5] == [{"a": 16}] + [{"a": 4}] * 4
    assert lines(steps, "spec")[1:5] == [{"a": [3, 1]}] * 4
    assert steps[4]["finished"] == ["a"]
    # 16 + 3 lookahead slots: 2 blocks; at step 3, 16 + 6 computed + 4 + 3 = 29 slots: still 2.
    assert steps[0]["free_blocks_sched"] == 97 and steps[3]["free_blocks_sched"] == 97
    row = result.requests.to_pylist()[0]
    assert (row["output_tokens"], row["spec_drafts"], row["spec_accepted"]) == (9, 12, 4)
    assert row["tpot_s"] == pytest.approx(0.005)
    assert summary["spec"] == {"draft_tokens": 12, "accepted_tokens": 4, "verifications": 4, "padded_requests": 0,
                               "padded_tokens": 0, "draft_feeds": 4}
    assert summary["spec_decoding_stats"] == {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 4}


def test_output_stops_at_max_tokens_inside_the_accepted_drafts():
    # max_tokens 3, every draft accepted: step 1 verifies 3 drafts and returns 4 tokens, but the request
    # had 1 output and may take 2 more: it finishes with exactly 3.
    eng = engine(speculative=spec(counts=[3]))
    steps, _, result = run_log(eng, [dict(id="a", prompt=16, max_tokens=3, at=0)])
    assert steps[1]["spec"] == {"a": [3, 3]} and steps[1]["finished"] == ["a"]
    assert result.requests.column("output_tokens").to_pylist() == [3]


# ---------------------------------------------------------------- padding and the EAGLE prefix rules


def _resend(version, **extra):
    # a: a 33-token prompt, one output, gone by step 2.  b: the same 33 tokens at step 2.
    eng = engine(vllm_version=version, kv_cache_groups=[{"type": "full"}], speculative=spec(counts=[2]), **extra)
    reqs = [dict(id="a", prompt=33, max_tokens=1, at=0, segments=[("p", 0, 33)]),
            dict(id="b", prompt=33, max_tokens=3, at=2, segments=[("p", 0, 33)])]
    return run_log(eng, reqs)


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0"])
def test_eagle_drops_the_last_matched_block(version):
    # b may hit floor(32 / 16) = 2 blocks; the EAGLE drop keeps 1: 16 hit tokens, 17 to compute, no padding.
    steps, summary, _ = _resend(version)
    assert steps[2]["new"] == {"b": 16} and steps[2]["sched"] == {"b": 17}
    assert steps[2]["spec"] == {} and steps[2]["spec_padded"] == []
    assert summary["prefix_cache_stats"]["hits"] == 16


def test_0_33_lookahead_hashes_keep_the_block_and_pad_the_one_token_admission():
    # 0.33 hashes each block with the token after it (num_hash_lookahead_tokens = 1) instead of dropping:
    # blocks 0 and 1 of a are keyed (their next tokens 16 and 32 exist) and b hits 32 tokens.  One token
    # is left, so b is padded to 1 + 3 with -1 drafts, listed in spec as [3, 0] and in spec_padded.
    # Step 3: b verifies 3 real drafts, accepts 2, and stops at max_tokens 3 (1 + 3 tokens, 2 kept).
    steps, summary, _ = _resend("0.33.0")
    assert steps[2]["new"] == {"b": 32} and steps[2]["sched"] == {"b": 4}
    assert steps[2]["spec"] == {"b": [3, 0]} and steps[2]["spec_padded"] == ["b"]
    assert steps[3]["spec"] == {"b": [3, 2]} and steps[3]["finished"] == ["b"]
    # The padding counts as drafts (vLLM's SpecDecodingStats too) but is no verification.
    assert summary["spec"]["draft_tokens"] == 6 and summary["spec"]["verifications"] == 1
    assert summary["spec"]["padded_requests"] == 1 and summary["spec"]["padded_tokens"] == 3
    assert summary["spec_decoding_stats"] == {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 2}


def test_no_padding_while_a_running_request_is_in_a_prefill_chunk():
    # c arrives at step 1 with 100 tokens and a 64-token budget: it is a prefill chunk after step 1, so at
    # step 2 (running pass schedules c's 36) b's one-token admission is not padded: 1 token.
    eng = engine(vllm_version="0.33.0", kv_cache_groups=[{"type": "full"}], speculative=spec(counts=[2]))
    reqs = [dict(id="a", prompt=33, max_tokens=1, at=0, segments=[("p", 0, 33)]),
            dict(id="c", prompt=100, max_tokens=2, at=1),
            dict(id="b", prompt=33, max_tokens=3, at=2, segments=[("p", 0, 33)])]
    steps, _, _ = run_log(eng, reqs)
    assert steps[1]["sched"] == {"c": 64}
    assert steps[2]["sched"] == {"c": 36, "b": 1} and steps[2]["spec_padded"] == []


def _lookahead_kv():
    from aisim._core.testing import KVCache

    # r0: 49 tokens of stream 1.  r1: its first 48 tokens and a different 49th.  r2: r0's 49 and 4 more.
    reqs = [[(1, 0, 49)], [(1, 0, 48), (2, 48, 5)], [(1, 0, 53)]]
    return reqs, KVCache


@pytest.mark.parametrize("eagle, lookahead, hits", [
    (False, 0, (48, 48)),   # no speculative decoding: full blocks hit
    (True, 0, (32, 32)),    # 0.31/0.32 EAGLE: one block dropped from each hit
    (False, 1, (32, 48)),   # 0.33: block 2's key covers token 48, which r1 does not share
])
def test_eagle_drop_against_lookahead_hashes(eagle, lookahead, hits):
    reqs, KVCache = _lookahead_kv()
    kv = KVCache(11, 16, 1024, reqs, eagle=eagle, hash_lookahead=lookahead, release="0.33.0" if lookahead else "0.32.0")
    assert kv.allocate_slots(0, 49) is not None
    # With lookahead hashes r0 keys floor((49 - 1) / 16) = 3 blocks; without, floor(49 / 16) = 3.
    assert len(kv.cached_hash_indices(0, 0)) == 3
    assert kv.get_computed_blocks(1)[0] == hits[0]
    assert kv.get_computed_blocks(2)[0] == hits[1]


def test_lookahead_hashes_wait_for_the_next_token():
    from aisim._core.testing import KVCache

    # 48 tokens: three full blocks, but the third block's key needs token 48, which does not exist yet.
    kv = KVCache(11, 16, 1024, [[(1, 0, 48)]], hash_lookahead=1, release="0.33.0")
    kv.allocate_slots(0, 48)
    assert kv.cached_hash_indices(0, 0) == [0, 1]
    kv.set_num_computed(0, 48)
    kv.append_outputs(0, 1)
    kv.cache_blocks(0, 48)
    assert kv.cached_hash_indices(0, 0) == [0, 1, 2]


def _mamba_engine(version, speculative):
    groups = [{"type": "full", "prefix_cacheable": True, "page_size_bytes": 1},
              {"type": "mamba", "prefix_cacheable": True, "page_size_bytes": 1, "prefill_checkpoint_blocks": 0}]
    eng = engine(num_gpu_blocks=200, block_size=64, max_num_batched_tokens=512, max_model_len=1024,
                 vllm_version=version, kv_cache_groups=groups, prefix_match_unit=64)
    if speculative:
        eng["speculative"] = spec(k=2)
    return eng


@pytest.mark.parametrize("version, speculative, chunks, free", [
    # Without drafts the last cacheable state of a 200-token prompt is at ((200 - 1) // 64) * 64 = 192
    # (4 blocks: 3 full attention + 1 state).
    ("0.32.0", False, [192, 8], 195),
    # 0.31 and 0.32 with the EAGLE drop back off one block: 0.31 200 - 200 % 64 - 64 = 128, 0.32
    # (200 // 64) * 64 - 64 = 128.  Blocks: full attention 128 + 2 lookahead slots -> 3, the state
    # group 1 + 2 draft blocks on its first allocation -> 6.
    ("0.31.0", True, [128, 72], 193),
    ("0.32.0", True, [128, 72], 193),
    # 0.33 has no drop (lookahead hashes): 192 again; full attention 194 slots -> 4 blocks, state 3 -> 7.
    ("0.33.0", True, [192, 8], 192),
])
def test_mamba_split_under_eagle(version, speculative, chunks, free):
    steps, _, _ = run_log(_mamba_engine(version, speculative), [dict(id="a", prompt=200, max_tokens=3, at=0)])
    assert [steps[i]["sched"]["a"] for i in (0, 1)] == chunks
    assert steps[0]["free_blocks_sched"] == free


# ---------------------------------------------------------------- acceptance rules


def test_splitmix64_by_hand():
    # z = 0 + 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) * 0x94D049BB133111EB;
    # z ^ z >> 31 (mod 2**64): the first output of splitmix64 seeded with 0.
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(1) == 0x910A2DEC89025CC1


def test_hash_rule_values_recorded_by_vllm():
    # spec_full_k3 (seed 7, permille [800, 600, 400], k = 3): request 1 (r1) verified 3 drafts four times
    # and accepted 1, 0, 1, 2 (vllm-0.33.0.jsonl steps 7 to 10).
    sp = parse_speculative(spec(permille=[800, 600, 400], seed=7))
    assert [accepted(sp, 1, n, 3) for n in range(4)] == [1, 0, 1, 2]
    # A lone permille applies to every position; 0 accepts nothing and 1000 everything.
    assert accepted(parse_speculative(spec(permille=0)), 5, 9, 3) == 0
    assert accepted(parse_speculative(spec(permille=1000)), 5, 9, 3) == 3


def test_counts_cycle_and_the_trace_list_comes_first():
    sp = parse_speculative(spec(counts=[2, 0, 5]))
    assert [accepted(sp, 0, n, 3) for n in range(4)] == [2, 0, 3, 2]   # min(m, counts[n % 3])
    assert [accepted(sp, 0, n, 3, accept=[1]) for n in range(2)] == [1, 1]


def test_histogram_draws():
    assert histogram_thresholds([0.25, 0.25, 0.5]) == [2**51, 2**52, 2**53]
    certain = parse_speculative(spec(k=2, histogram=[0.0, 0.0, 1.0]))
    assert {accepted(certain, i, n, 2) for i in range(5) for n in range(5)} == {2}
    never = parse_speculative(spec(k=2, histogram=[1.0, 0.0, 0.0]))
    assert {accepted(never, i, n, 2) for i in range(5) for n in range(5)} == {0}


def test_the_core_applies_the_same_rules():
    # Request index i and verification n give the same acceptance in the core as in Python.
    acc = {"permille": [900, 500], "seed": 3}
    eng = engine(speculative=spec(k=2, **acc))
    reqs = [dict(id=f"r{i}", prompt=16, max_tokens=40, at=0) for i in range(3)]
    steps, _, _ = run_log(eng, reqs)
    sp = parse_speculative(spec(k=2, **acc))
    seen = {}
    for s in steps.values():
        for rid, (m, a) in s["spec"].items():
            i = int(rid[1:])
            assert a == accepted(sp, i, seen.get(i, 0), m), (rid, seen.get(i, 0))
            seen[i] = seen.get(i, 0) + 1
    assert sum(seen.values()) > 10


def test_trace_accept_lists_drive_the_core():
    eng = engine(speculative=spec(counts=[0]))
    steps, _, _ = run_log(eng, [dict(id="a", prompt=16, max_tokens=12, at=0, accept=[3, 1])])
    assert lines(steps, "spec")[1:5] == [{"a": [3, 3]}, {"a": [3, 1]}, {"a": [3, 3]}, {"a": [3, 1]}]


# ---------------------------------------------------------------- step time and configuration


def test_drafter_cost_and_verified_drafts_in_the_step_time():
    # Linear model 0.01 + 0.001 per token; a drafter at half the target's time on steps that sample.
    # Step 0 prefills 16 tokens and samples: (0.01 + 0.016) * 1.5 = 0.039.  Step 1 verifies 1 + 3 tokens:
    # (0.01 + 0.004) * 1.5 = 0.021.
    eng = engine(time_model={"base_s": 0.01, "per_token_s": 0.001},
                 speculative=dict(spec(counts=[0]), drafter_cost=0.5))
    _, _, result = run_log(eng, [dict(id="a", prompt=16, max_tokens=3, at=0)])
    d = result.steps.column("duration_s").to_pylist()
    assert d[0] == pytest.approx(0.039) and d[1] == pytest.approx(0.021)
    eng["speculative"]["drafter_cost"] = {"base_s": 0.002, "per_token_s": 0.0005}
    _, _, result = run_log(eng, [dict(id="a", prompt=16, max_tokens=3, at=0)])
    d = result.steps.column("duration_s").to_pylist()
    assert d[0] == pytest.approx(0.026 + 0.002 + 0.008) and d[1] == pytest.approx(0.014 + 0.002 + 0.002)


def test_drafter_costs_nothing_on_a_step_of_prefill_chunks():
    # 100 tokens, 64-token budget: step 0 is a chunk (samples nothing), step 1 ends the prompt.
    eng = engine(speculative=dict(spec(), drafter_cost=1.0))
    _, _, result = run_log(eng, [dict(id="a", prompt=100, max_tokens=2, at=0)])
    assert result.steps.column("duration_s").to_pylist()[:2] == [pytest.approx(0.01), pytest.approx(0.02)]


@pytest.mark.parametrize("version, block_drop, hash_lookahead, step_blocks", [
    ("0.31.0", True, None, None), ("0.32.0", True, None, 1), ("0.33.0", False, 1, 1)])
def test_scheduler_view_by_release(version, block_drop, hash_lookahead, step_blocks):
    cfg = engine_config_from_dict(engine(vllm_version=version, kv_cache_groups=[{"type": "full"}],
                                         speculative=spec(permille=650, seed=3)))
    v = scheduler_view(cfg)
    assert list(v) == ["method", "num_speculative_tokens", "num_lookahead_tokens", "num_prefill_lookahead_tokens",
                       "draft_slots", "use_eagle", "use_eagle_block_drop", "num_hash_lookahead_tokens",
                       "spec_decode_step_blocks", "num_speculative_blocks", "async_scheduling", "acceptance"]
    assert (v["use_eagle_block_drop"], v["num_hash_lookahead_tokens"], v["spec_decode_step_blocks"]) == \
        (block_drop, hash_lookahead, step_blocks)
    assert v["acceptance"] == {"permille": 650, "seed": 3}


@pytest.mark.parametrize("method, lookahead, prefill, slots, eagle", [
    ("eagle", 3, 1, 0, True), ("mtp", 3, 1, 0, True), ("draft_model", 3, 0, 1, False), ("ngram", 0, 0, 0, False)])
def test_scheduler_view_by_method(method, lookahead, prefill, slots, eagle):
    v = scheduler_view(engine_config_from_dict(engine(speculative=spec(method=method))))
    assert (v["num_lookahead_tokens"], v["num_prefill_lookahead_tokens"], v["draft_slots"], v["use_eagle"]) == \
        (lookahead, prefill, slots, eagle)
    # Without prefix caching 0.33 keeps the drop flag (nothing is hashed).
    v = scheduler_view(engine_config_from_dict(engine(enable_prefix_caching=False, speculative=spec(method=method))))
    assert (v["use_eagle_block_drop"], v["num_hash_lookahead_tokens"]) == (eagle, 0)


@pytest.mark.parametrize("bad, message", [
    ({"method": "eagle"}, "'speculative.num_speculative_tokens' in e.json is required"),
    ({"num_speculative_tokens": 0}, "'speculative.num_speculative_tokens' in e.json must be a positive integer, got 0"),
    ({"num_speculative_tokens": 2, "method": "medusa"},
     "'speculative.method' in e.json must be one of eagle, mtp, draft_model, ngram, got 'medusa'"),
    ({"num_speculative_tokens": 2, "k": 1},
     "unknown key 'speculative.k' in e.json; known keys: num_speculative_tokens, method, acceptance, drafter_cost"),
    ({"num_speculative_tokens": 2, "acceptance": {"permille": 1001}},
     "'speculative.acceptance.permille' in e.json must be an integer in [0, 1000] or a non-empty list of them, "
     "got 1001"),
    ({"num_speculative_tokens": 2, "acceptance": {"counts": [1], "permille": 500}},
     "'speculative.acceptance' in e.json takes one of counts, permille and histogram, got counts and permille"),
    ({"num_speculative_tokens": 2, "acceptance": {"counts": []}},
     "'speculative.acceptance.counts' in e.json must be a non-empty list of non-negative integers, got []"),
    ({"num_speculative_tokens": 2, "acceptance": {"histogram": [0.5, 0.5]}},
     "'speculative.acceptance.histogram' in e.json must be a list of 3 non-negative probabilities (exactly "
     "0 .. 2 drafts accepted), got [0.5, 0.5]"),
    ({"num_speculative_tokens": 2, "acceptance": {"histogram": [0.5, 0.5, 0.5]}},
     "'speculative.acceptance.histogram' in e.json must sum to 1, got 1.5"),
    ({"num_speculative_tokens": 2, "acceptance": {"seed": -1}},
     "'speculative.acceptance.seed' in e.json must be an integer in [0, 2**64), got -1"),
    ({"num_speculative_tokens": 2, "drafter_cost": -0.1},
     "'speculative.drafter_cost' in e.json must be a non-negative fraction of the step time or a mapping with "
     "base_s and per_token_s, got -0.1"),
    ({"num_speculative_tokens": 2, "drafter_cost": {"base": 1}},
     "unknown key 'speculative.drafter_cost.base' in e.json; known keys: base_s, per_token_s"),
])
def test_bad_speculative_configuration_names_the_key(bad, message):
    with pytest.raises(ConfigError) as exc:
        engine_config_from_dict(engine(speculative=bad), source="e.json")
    assert str(exc.value) == message


def test_relations_with_other_keys():
    with pytest.raises(ConfigError, match=r"'long_prefill_token_threshold' \(3\) must exceed "
                                          r"'speculative.num_speculative_tokens' \(3\) or be 0"):
        engine_config_from_dict(engine(long_prefill_token_threshold=3, speculative=spec()))
    groups = [{"type": "full", "prefix_cacheable": True, "page_size_bytes": 1},
              {"type": "mamba", "prefix_cacheable": True, "page_size_bytes": 1, "prefill_checkpoint_blocks": 0,
               "num_speculative_blocks": 1}]
    with pytest.raises(ConfigError, match=r"'kv_cache_groups\[1\].num_speculative_blocks' \(1\) must equal "
                                          r"'speculative.num_speculative_tokens' \(2\)"):
        engine_config_from_dict(engine(block_size=64, kv_cache_groups=groups, prefix_match_unit=64,
                                       vllm_version="0.33.0", speculative=spec(k=2)))
    with pytest.raises(ConfigError, match="cannot prefix-cache chunked local attention under the EAGLE block drop"):
        engine_config_from_dict(engine(vllm_version="0.32.0", kv_cache_groups=[
            {"type": "chunked_local", "attention_chunk_size": 64}], speculative=spec()))


@pytest.mark.parametrize("eagle, hit, blocks", [(False, 64, [0, 0, 3, 4]), (True, 48, [0, 2, 3])])
def test_sliding_window_hit_under_the_eagle_drop(eagle, hit, blocks):
    from aisim._core.testing import KVCache

    # One sliding-window group, window 32, blocks of 16: a hit needs ceil(31 / 16) = 2 cached blocks ending
    # at its end.  r1 extends r0's 64 cached tokens; it may hit floor(79 / 16) = 4 blocks.  Without EAGLE
    # blocks 2 and 3 make the run: 64 tokens, blocks before the window null.  With the drop the run needs
    # 3 blocks (1, 2, 3) and the last is dropped: 48 tokens (SlidingWindowManager._contiguous_blocks_for_hit).
    group = dict(kind=1, block_size=16, window=32, cacheable=True, align_mode=False, num_spec=0, has_ckpt=False,
                 ckpt_align=0, admission_cap=-1, spec_group=0)
    kv = KVCache(20, 16, 1024, [[(1, 0, 64)], [(1, 0, 80)]], groups=[group], hash_block_size=16,
                 sched_block_size=16, eagle=eagle, release="0.32.0")
    assert kv.allocate_slots(0, 64) == [1, 2, 3, 4]
    assert kv.get_computed_blocks(1) == (hit, blocks)
