"""The seed's GLM-5.3-Flash derivations, replayed through the grouped KV cache.

GLM-5.3-Flash as the seed describes it: every group has 2,176-token blocks
(page-size unification), hash block 2,176, one full-attention group, one ring
group (one block per request, never cached) and four KDA state groups in
align mode; engine default retention 0; budget 8,192.  The pool has 64 usable
blocks, as in the seed's "8 / 64" figure.
"""

import pytest

from aisim.config.versions import SUPPORTED_VLLM_VERSIONS

from helpers import run_log

VERSIONS = list(SUPPORTED_VLLM_VERSIONS)


PAGE = 2176 * 1024  # the unified page: 2,176 tokens x 1,024 bytes


def glm_engine(version, checkpoint, max_model_len=65536, num_gpu_blocks=65):
    kda = {"type": "kda", "count": 4, "prefix_cacheable": True, "page_size_bytes": PAGE,
           "prefill_checkpoint_blocks": 0}
    if checkpoint:
        # KDA + flashkda: one prefill checkpoint block, alignment 16.
        kda.update(prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=16)
    # 64 usable blocks need a max_model_len below the seed's 131,072 to pass
    # the start-up capacity check (61 + 8 + 1 = 70 blocks there).
    return dict(model="GLM-5.3-Flash", num_gpu_blocks=num_gpu_blocks, block_size=2176, prefix_match_unit=2176,
                max_num_batched_tokens=8192, max_num_seqs=16, max_model_len=max_model_len, vllm_version=version,
                kv_cache_groups=[{"type": "full", "prefix_cacheable": True, "page_size_bytes": PAGE},
                                 {"type": "ring", "prefix_cacheable": False, "page_size_bytes": PAGE}, kda])


# A multi-turn conversation: every turn resends the whole history.
TURNS = [dict(id="t1", prompt=9000, max_tokens=2, at=0, segments=[("conv", 0, 9000)]),
         dict(id="t2", prompt=13000, max_tokens=2, at=10, segments=[("conv", 0, 13000)]),
         dict(id="t3", prompt=20000, max_tokens=2, at=20, segments=[("conv", 0, 20000)]),
         dict(id="share", prompt=3000, max_tokens=2, at=30, segments=[("conv", 0, 2176), ("x", 2176, 824)])]


def _active_after_schedule(line):
    return 64 - line["free_blocks_sched"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("checkpoint", [False, True])
def test_multi_turn_hits(version, checkpoint):
    steps, _, result = run_log(glm_engine(version, checkpoint), TURNS)
    new = {rid: hit for line in steps.values() for rid, hit in line["new"].items()}
    assert new["t2"] == 8704    # (9000 - 1) // 2176 * 2176
    assert new["t3"] == 10880   # (13000 - 1) // 2176 * 2176
    assert new["share"] == 0    # retention 0 keeps no KDA state at 2,176


@pytest.mark.parametrize("version", VERSIONS)
def test_turn_two_first_step_blocks(version):
    # Without checkpoint blocks the chunk stops at the last cacheable boundary
    # 10,880: 5 attention blocks (4 hit + 1 fresh), 1 ring block, and per KDA
    # group the hit state plus one new state: 5 + 1 + 4 * 2 = 14.
    steps, _, result = run_log(glm_engine(version, False), TURNS)
    assert steps[10]["sched"] == {"t2": 2176}
    assert _active_after_schedule(steps[10]) == 14
    # The seed says the 4 hit states "return to the cache after the step, so 10
    # stay active".  vLLM frees them at the next allocate_slots
    # (MambaManager.remove_skipped_blocks), in the same call that allocates the
    # next chunk's attention block and one new state per KDA group, so the
    # second step holds 14 - 4 + 1 + 4 = 15 while the 4 states are cached again.
    st = result.steps.to_pydict()
    i = st["step"].index(11)
    assert st["cached_blocks"][i] - st["cached_blocks"][st["step"].index(10)] == 4
    assert _active_after_schedule(steps[11]) == 15


@pytest.mark.parametrize("version", VERSIONS)
def test_turn_two_first_step_blocks_with_checkpoints(version):
    # With prefill checkpoint blocks the chunk runs to the prompt end: 6
    # attention blocks, 1 ring block, 3 per KDA group (hit, checkpoint, state).
    steps, _, _ = run_log(glm_engine(version, True), TURNS)
    assert steps[10]["sched"] == {"t2": 4296}
    assert _active_after_schedule(steps[10]) == 19


@pytest.mark.parametrize("version", VERSIONS)
def test_after_one_request_ends(version):
    # After one 9,000-token request: 4 attention blocks and 4 KDA states at
    # 8,704 stay cached; physical usage 8 / 64, active usage 0.
    steps, _, result = run_log(glm_engine(version, False), TURNS[:1])
    st = result.steps.to_pydict()
    last = len(st["step"]) - 1
    assert st["cached_blocks"][last] == 8
    assert st["physical_usage"][last] == 8 / 64
    assert st["kv_usage"][last] == 0.0
    assert st["active_blocks"][last] == 0
