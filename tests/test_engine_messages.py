import msgspec
from test_engine_fakes import make_core, make_request

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.core_types.scheduler_output import SchedulerOutput
from kernelcore.engine.outputs import EngineCoreOutputs, RequestOutput
from kernelcore.engine.request import EngineCoreRequest


def _roundtrip(obj, typ):
    for codec in (msgspec.msgpack, msgspec.json):
        assert codec.decode(codec.encode(obj), type=typ) == obj


def test_messages_roundtrip_through_msgspec():
    core = make_core(max_num_batched_tokens=8)
    req = make_request("a", list(range(1, 20)), max_tokens=4, logprobs=2, prompt_logprobs=1, stop=["x"], seed=3)
    _roundtrip(req, EngineCoreRequest)
    core.add_request(msgspec.msgpack.decode(msgspec.msgpack.encode(req), type=EngineCoreRequest))
    core.add_request(make_request("b", [4, 5, 6], max_tokens=3))
    while core.has_unfinished_requests():
        so = core.scheduler.schedule()
        _roundtrip(so, SchedulerOutput)
        runner_output = core.executor.execute_model(
            msgspec.msgpack.decode(msgspec.msgpack.encode(so), type=SchedulerOutput))
        outputs = EngineCoreOutputs(core.scheduler.update_from_output(so, runner_output), core.scheduler.make_stats())
        encoded = msgspec.msgpack.encode(outputs)
        assert msgspec.msgpack.decode(encoded, type=EngineCoreOutputs).outputs == outputs.outputs


def test_sampling_params_defaults_and_request_output_roundtrip():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens) == (1, 1.0, 1.0, -1, 16)
    assert msgspec.json.decode(msgspec.json.encode(SamplingParams(temperature=0, stop="a")),
                               type=SamplingParams).stop == ["a"]
    from kernelcore.engine.outputs import CompletionOutput, Logprob

    out = RequestOutput(request_id="1", prompt="hi", prompt_token_ids=[1], outputs=[CompletionOutput(
        index=0, text="x", token_ids=[5], logprobs=[{5: Logprob(-0.1, 1, "x")}], finish_reason="length")],
        finished=True)
    _roundtrip(out, RequestOutput)


def test_engine_stats_per_step():
    core = make_core(max_num_batched_tokens=8)
    core.add_request(make_request("a", list(range(1, 13)), max_tokens=3))
    stats = [core.step().stats for _ in range(4)]
    assert stats[0].num_prompt_tokens == 8 and stats[0].num_generation_tokens == 0 and stats[0].num_running == 1
    assert stats[1].num_prompt_tokens == 4 and stats[1].num_generation_tokens == 1
    assert stats[3].num_finished == 1 and stats[3].num_running == 0 and stats[3].kv_cache_usage == 0.0
    core.add_request(make_request("b", list(range(1, 13)), max_tokens=2))
    s = core.step().stats
    assert s.num_prefix_cache_queries == 12 and s.num_prefix_cache_hits == 8
