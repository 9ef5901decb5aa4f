"""Pipeline parallelism on one host: layers split over stages (TP within a stage) give the same greedy tokens
and top-5 logprobs as one process."""

import json

import pytest
from helpers import run_python
from test_multinode import greedy_script

pytestmark = pytest.mark.slow  # spawns pipeline-stage worker processes


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from conftest_models import make_llama_checkpoint, make_opt_checkpoint

    return {"llama": make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=3),
            "opt": make_opt_checkpoint(str(tmp_path_factory.mktemp("opt")), num_hidden_layers=3)}


def _run(model_dir, args):
    return json.loads(run_python(greedy_script(model_dir, args)).stdout.strip().splitlines()[-1])


def assert_same(reference, result):
    (tokens_1, logprobs_1), (tokens_2, logprobs_2) = reference, result
    assert tokens_1 == tokens_2 and all(len(t) == 16 for t in tokens_1.values())
    for rid in logprobs_1:
        for a, b in zip(logprobs_1[rid], logprobs_2[rid], strict=True):
            assert a == pytest.approx(b, abs=2e-4)


@pytest.mark.parametrize("model,tp,pp", [("llama", 1, 2), ("opt", 1, 2), ("llama", 2, 2)])
def test_pipeline_parallel_matches_one_process(model, tp, pp, model_dirs):
    reference = _run(model_dirs[model], "tensor_parallel_size=1")
    # 3 layers over 2 stages: an uneven split (2 + 1), the tied OPT head on a stage without the embedding
    assert_same(reference, _run(model_dirs[model], f"tensor_parallel_size={tp}, pipeline_parallel_size={pp}"))


def test_a_model_without_pipeline_support_is_refused(model_dirs):
    proc = run_python("""
        from kernelcore.config_builder import build_config
        from kernelcore.models.registry import model_registry
        from kernelcore.models.loader import get_model
        config = build_config(model=MODEL, pipeline_parallel_size=2)
        cls = model_registry.get_model_cls(config.model.architecture)
        cls.supports_pipeline_parallel = False
        try:
            get_model(config)
        except ValueError as exc:
            print("ERROR:", exc)
    """.replace("MODEL", repr(model_dirs["llama"])))
    assert "ERROR: LlamaForCausalLM does not support pipeline parallelism" in proc.stdout


STAGGERED = """
import json
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
if __name__ == "__main__":
    core = EngineCore(build_config(model=MODEL, kv_cache_memory=1 << 24, ARGS))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)
    tokens, logprobs = {}, {}

    def collect(outputs):
        for o in outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            logprobs.setdefault(o.request_id, []).extend(lp.logprobs for lp in o.new_logprobs or [])

    for i, p in enumerate(PROMPTS):  # arriving one step apart: separate batches, each filling a stage
        core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=p, sampling_params=params))
        collect(core.step().outputs)
    while core.has_unfinished_requests():
        collect(core.step().outputs)
    peak = core.peak_batches_in_flight
    core.shutdown()
    print(json.dumps([tokens, logprobs, peak]), flush=True)
"""


@pytest.mark.parametrize("model", ["llama", "opt"])
def test_pipeline_keeps_a_batch_per_stage_in_flight_and_matches_one_process(model, model_dirs):
    from test_multinode import PROMPTS

    def run(args):
        script = STAGGERED.replace("MODEL", repr(model_dirs[model])).replace("ARGS", args)
        return json.loads(run_python(script.replace("PROMPTS", repr(PROMPTS))).stdout.strip().splitlines()[-1])

    *reference, peak_1 = run("tensor_parallel_size=1")
    *result, peak_2 = run("pipeline_parallel_size=2")
    assert peak_1 == 0 and peak_2 == 2  # one batch per stage in flight: stage 0 runs one while stage 1 runs another
    assert_same(reference, result)
