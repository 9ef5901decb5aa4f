"""The engine-core process's output coalescing: a final-only request without stop strings gets its first token
at once and the rest in one output when it finishes; streamed and stop-string requests pass step by step; held
statistics are merged (counters summed, per-step token counts kept) and go out when the gauges change, when the
engine falls idle, or after the flush interval."""

from __future__ import annotations

from kernelcore.core_types.runner_output import TokenLogprobs
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.output_coalescer import OutputCoalescer
from kernelcore.engine.outputs import EngineCoreOutput, EngineCoreOutputs
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.metrics.stats import EngineStats


def request(request_id: str, **params) -> EngineCoreRequest:
    return EngineCoreRequest(request_id=request_id, prompt_token_ids=[1, 2], sampling_params=SamplingParams(**params))


def step(*outputs: EngineCoreOutput, running: int = 1, tokens: int = 1, errors=None) -> EngineCoreOutputs:
    stats = EngineStats(timestamp=1.0, num_running=running, num_generation_tokens=tokens, num_prefix_cache_queries=2,
                        step_time=0.01, iteration_tokens=[tokens])
    return EngineCoreOutputs(list(outputs), stats, 1.0, errors or {})


def logprob(token: int) -> list[TokenLogprobs]:
    return [TokenLogprobs(token_ids=[token], logprobs=[-0.5], rank=1)]


def test_final_only_request_sends_its_first_token_then_one_merged_output():
    c = OutputCoalescer(flush_interval=1e9)
    c.add_request(request("r", output_kind="final_only", logprobs=0))
    first = c.coalesce(step(EngineCoreOutput("r", [], num_cached_tokens=16), EngineCoreOutput("r", [5])))
    assert first is not None and [o.new_token_ids for o in first.outputs] == [[], [5]]  # prefill, then token 1
    for token in (6, 7, 8):
        assert c.coalesce(step(EngineCoreOutput("r", [token], new_logprobs=logprob(token)))) is None
    last = c.coalesce(step(EngineCoreOutput("r", [9], finish_reason="length", new_logprobs=logprob(9)), running=0))
    assert last is not None
    (out,) = last.outputs
    assert out.new_token_ids == [6, 7, 8, 9] and out.finish_reason == "length"
    assert [lp.token_ids[0] for lp in out.new_logprobs] == [6, 7, 8, 9]
    # four steps' statistics in one report: counters summed, the last gauges, each step's tokens
    assert last.stats.num_generation_tokens == 4 and last.stats.num_prefix_cache_queries == 8
    assert last.stats.iteration_tokens == [1, 1, 1, 1] and last.stats.num_running == 0
    assert not c.held and not c.holdable and c.stats is None


def test_streamed_and_stop_string_requests_pass_every_step():
    c = OutputCoalescer(flush_interval=1e9)
    c.add_request(request("s"))  # cumulative: streamed
    c.add_request(request("t", output_kind="final_only", stop=["end"]))  # the front end searches its text
    for token in range(4):
        sent = c.coalesce(step(EngineCoreOutput("s", [token]), EngineCoreOutput("t", [token])))
        assert sent is not None and [o.request_id for o in sent.outputs] == ["s", "t"]


def test_held_statistics_go_out_on_a_gauge_change_the_interval_or_idle():
    c = OutputCoalescer(flush_interval=1e9)
    c.add_request(request("r", output_kind="final_only"))
    assert c.coalesce(step(EngineCoreOutput("r", [1]))) is not None
    assert c.coalesce(step(EngineCoreOutput("r", [2]))) is None
    changed = c.coalesce(step(EngineCoreOutput("r", [3]), running=2))  # another request started
    assert changed is not None and changed.outputs == [] and changed.stats.num_generation_tokens == 2
    assert c.coalesce(step(EngineCoreOutput("r", [4]), running=2)) is None
    idle = c.flush()
    assert idle is not None and idle.stats.iteration_tokens == [1] and c.flush() is None
    c.flush_interval = 0.0
    assert c.coalesce(step(EngineCoreOutput("r", [5]), running=2)).outputs == []  # statistics only, on time
    assert c.held["r"].new_token_ids == [2, 3, 4, 5]  # the tokens wait for the finish all along


def test_aborted_and_failed_requests_are_forgotten():
    c = OutputCoalescer(flush_interval=1e9)
    for rid in ("a", "b"):
        c.add_request(request(rid, output_kind="final_only"))
        c.coalesce(step(EngineCoreOutput(rid, [1])))
        c.coalesce(step(EngineCoreOutput(rid, [2])))
    assert set(c.held) == {"a", "b"}
    c.forget(["a"])
    failed = c.coalesce(step(EngineCoreOutput("b", [3]), errors={"b": "adapter gone"}))
    assert failed is not None and failed.errors == {"b": "adapter gone"}
    assert not c.held and not c.holdable and not c.waiting_first
