import random

import pytest
from test_engine_fakes import make_core, make_request, reference_greedy, run_to_completion

from kernelcore.engine.scheduler import RequestRejected


def _prompt(rng, n):
    return [rng.randrange(1, 64) for _ in range(n)]


def test_greedy_matches_reference_with_chunked_prefill():
    core = make_core(max_num_batched_tokens=8)
    rng = random.Random(0)
    prompts = {f"r{i}": _prompt(rng, rng.randrange(1, 30)) for i in range(6)}
    for rid, p in prompts.items():
        core.add_request(make_request(rid, p, max_tokens=9))
    results = run_to_completion(core)
    for rid, p in prompts.items():
        assert results[rid][0] == reference_greedy(p, 9)
        assert results[rid][1] == "length"
    assert core.scheduler.kv.num_free_blocks == core.num_blocks


def test_token_budget_and_max_num_seqs_respected():
    core = make_core(max_num_batched_tokens=10, max_num_seqs=3)
    for i in range(6):
        core.add_request(make_request(f"r{i}", list(range(1, 15)), max_tokens=4))
    while core.has_unfinished_requests():
        so = core.scheduler.schedule()
        assert so.total_num_scheduled_tokens <= 10
        assert len(so.num_scheduled_tokens) <= 3 and len(core.scheduler.running) <= 3
        core.scheduler.update_from_output(so, core.executor.execute_model(so))


def test_preemption_under_tiny_cache_gives_same_greedy_output():
    rng = random.Random(1)
    prompts = {f"r{i}": _prompt(rng, rng.randrange(5, 20)) for i in range(8)}
    big = make_core(num_blocks=256)
    tiny = make_core(num_blocks=12, block_size=4)
    for core in (big, tiny):
        for rid, p in prompts.items():
            core.add_request(make_request(rid, p, max_tokens=24))
    expected, got = run_to_completion(big), run_to_completion(tiny)
    assert got == expected
    assert tiny.scheduler.num_preemptions_total > 0
    assert tiny.scheduler.kv.num_free_blocks == tiny.num_blocks


@pytest.mark.parametrize("seed", range(5))
def test_no_block_leaks_after_random_finish_abort_preempt(seed):
    rng = random.Random(seed)
    core = make_core(num_blocks=20, block_size=4, max_num_batched_tokens=16, max_num_seqs=6)
    next_id, live = 0, set()
    for _ in range(300):
        if rng.random() < 0.3:
            rid = f"r{next_id}"
            next_id += 1
            core.add_request(make_request(rid, _prompt(rng, rng.randrange(1, 30)), max_tokens=rng.randrange(1, 40),
                                          eos_token_id=rng.choice([None, 3]), temperature=rng.choice([0.0, 1.0])))
            live.add(rid)
        if live and rng.random() < 0.1:
            victim = rng.choice(sorted(live))
            core.abort_requests([victim])
            live.discard(victim)
        for out in core.step().outputs:
            if out.finish_reason:
                live.discard(out.request_id)
        kv = core.scheduler.kv
        in_use = sum(len(r.block_ids) for r in core.scheduler.running)
        assert kv.num_free_blocks + len({b for r in core.scheduler.running for b in r.block_ids}) == kv.num_blocks
        assert in_use >= kv.num_blocks - kv.num_free_blocks
    core.abort_requests(sorted(live))
    core.step()
    assert not core.has_unfinished_requests()
    assert core.scheduler.kv.num_free_blocks == core.num_blocks
    assert all(c == 0 for c in core.scheduler.kv.ref_counts)
    assert core.executor.worker.requests == {}


def test_abort_frees_blocks_at_once():
    core = make_core()
    core.add_request(make_request("a", list(range(1, 20)), max_tokens=50))
    core.step()
    assert core.scheduler.kv.num_free_blocks < core.num_blocks
    core.abort_requests(["a"])
    assert core.scheduler.kv.num_free_blocks == core.num_blocks
    assert not core.has_unfinished_requests()


def test_rejects_requests_that_can_never_fit():
    core = make_core(num_blocks=8, block_size=4, max_model_len=100)
    with pytest.raises(RequestRejected, match="maximum context length"):
        core.add_request(make_request("a", [1] * 89, max_tokens=20))
    with pytest.raises(RequestRejected, match="whole cache"):
        core.add_request(make_request("b", list(range(1, 30)), max_tokens=20))
    with pytest.raises(RequestRejected, match="empty"):
        core.add_request(make_request("c", [], max_tokens=2))
    with pytest.raises(RequestRejected, match="out of vocabulary"):
        core.add_request(make_request("d", [1, 9999], max_tokens=2))
    assert not core.has_unfinished_requests()


def test_stop_conditions():
    prompt = [5, 6, 7]
    ref = reference_greedy(prompt, 10)
    core = make_core()
    core.add_request(make_request("eos", prompt, eos_token_id=ref[3], max_tokens=10))
    core.add_request(make_request("ignore", prompt, eos_token_id=ref[3], ignore_eos=True, max_tokens=10))
    core.add_request(make_request("stopid", prompt, stop_token_ids=[ref[2]], max_tokens=10))
    results = run_to_completion(core)
    assert results["eos"] == [ref[:4], "stop", None]
    assert results["ignore"] == [ref, "length", None]
    assert results["stopid"] == [ref[:3], "stop", ref[2]]


def test_min_tokens_masks_eos():
    prompt = [5, 6, 7]
    ref = reference_greedy(prompt, 1)
    core = make_core()
    core.add_request(make_request("a", prompt, eos_token_id=ref[0], min_tokens=3, max_tokens=10))
    tokens, reason, _ = run_to_completion(core)["a"]
    assert ref[0] not in tokens[:3] and len(tokens) >= 3


def test_prefix_cache_hit_gives_same_tokens_and_skips_compute():
    prompt = list(range(1, 41))
    core = make_core()
    core.add_request(make_request("a", prompt, max_tokens=5))
    first = run_to_completion(core)["a"]
    computed = core.executor.worker.model_runner.num_computed
    core.add_request(make_request("b", prompt, max_tokens=5))
    second = run_to_completion(core)["b"]
    assert first == second
    assert core.executor.worker.model_runner.num_computed - computed < 10
    assert core.scheduler.kv.num_hits >= 36


def test_parallel_samples_share_prompt_blocks():
    core = make_core()
    prompt = list(range(1, 34))
    for i in range(4):
        core.add_request(make_request(f"{i}_p", prompt, max_tokens=3, temperature=1.0, seed=i).__class__(
            request_id=f"{i}_p", prompt_token_ids=prompt, parent_id="p",
            sampling_params=make_request("x", prompt, max_tokens=3, temperature=1.0, seed=i).sampling_params))
    run_to_completion(core)
    # 33 tokens: the first sample computes them all, each sibling only the partial tail block.
    assert core.executor.worker.model_runner.num_computed <= 33 + 3 * (4 + 1) + 4 * 3
