"""LoRA through the engine: prompt logprobs match transformers+peft for TP=1 and TP=2 (mixed with base requests),
the scheduler keeps at most max_loras adapters running, the prefix cache is keyed by adapter."""

from __future__ import annotations

import json

import pytest
import torch
from conftest_models import make_llama_checkpoint, make_opt_checkpoint
from helpers import run_python
from lora_helpers import make_peft_adapter, peft_logits
from test_models_parity import random_tokens

pytestmark = pytest.mark.slow  # spawns engines and TP workers beside peft


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-engine")
    out = {}
    for arch, make in (("llama", make_llama_checkpoint), ("opt", make_opt_checkpoint)):
        base = make(str(root / arch))
        out[arch] = (base, [make_peft_adapter(base, str(root / f"{arch}-{i}"), arch, seed=i, rank=8, alpha=16,
                                              use_rslora=i == 2) for i in (1, 2)])
    return out


ENGINE_SCRIPT = """
import json
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
if __name__ == "__main__":
    core = EngineCore(build_config(model=MODEL, tensor_parallel_size=TP, kv_cache_memory=1 << 24, enable_lora=True,
                                   max_loras=2, max_lora_rank=8, max_num_batched_tokens=64))
    for i, path in enumerate(ADAPTERS):
        core.add_lora(i + 1, f"adapter-{i + 1}", path)
    for i, (prompt, lora_id) in enumerate(zip(PROMPTS, LORA_IDS)):
        core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=prompt, lora_id=lora_id,
                         sampling_params=SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)))
    logprobs = {}
    while core.has_unfinished_requests():
        for o in core.step().outputs:
            logprobs.setdefault(o.request_id, []).extend(lp.logprobs[0] for lp in o.new_prompt_logprobs or [])
    core.shutdown()
    print(json.dumps(logprobs))
"""


def engine_prompt_logprobs(base: str, adapters: list[str], prompts, lora_ids, tp: int) -> dict[str, list[float]]:
    script = ENGINE_SCRIPT
    for key, value in (("MODEL", base), ("TP", tp), ("ADAPTERS", adapters), ("PROMPTS", prompts),
                       ("LORA_IDS", lora_ids)):
        script = script.replace(key, repr(value))
    return json.loads(run_python(script, timeout=300).stdout.strip().splitlines()[-1])


def reference_prompt_logprobs(base: str, adapter: str | None, prompt: list[int]) -> list[float]:
    logprobs = torch.log_softmax(peft_logits(base, adapter, prompt), -1)
    return [logprobs[i - 1, t].item() for i, t in enumerate(prompt) if i]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_prompt_logprobs_match_peft_in_a_mixed_batch(models, arch, tp):
    base, adapters = models[arch]
    prompts = [random_tokens(n, seed=n) for n in (37, 20, 45, 29)]
    lora_ids = [1, 0, 2, 1]
    ours = engine_prompt_logprobs(base, adapters, prompts, lora_ids, tp)
    for i, (prompt, lora_id) in enumerate(zip(prompts, lora_ids, strict=True)):
        ref = reference_prompt_logprobs(base, adapters[lora_id - 1] if lora_id else None, prompt)
        assert ours[str(i)] == pytest.approx(ref, abs=5e-4), f"request {i} (lora {lora_id})"


def _scheduler(max_loras: int = 2):
    from kernelcore.config import KernelConfig, LoraConfig, ModelConfig
    from kernelcore.engine.scheduler import Scheduler

    config = KernelConfig(model=ModelConfig(max_model_len=256), lora=LoraConfig(enable_lora=True, max_loras=max_loras))
    scheduler = Scheduler(config, num_blocks=64, block_size=16)
    for lora_id in (1, 2, 3):
        scheduler.lora_names[lora_id] = f"a{lora_id}"
    return scheduler


def _request(request_id: str, lora_id: int, prompt: list[int] | None = None):
    from kernelcore.core_types.sampling_params import SamplingParams
    from kernelcore.engine.request import EngineCoreRequest

    return EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt or [5, 6, 7, 8], lora_id=lora_id,
                             sampling_params=SamplingParams(max_tokens=4, ignore_eos=True))


def test_scheduler_keeps_at_most_max_loras_adapters_running():
    from kernelcore.core_types.runner_output import ModelRunnerOutput
    from kernelcore.engine.scheduler import RequestRejected

    scheduler = _scheduler(max_loras=2)
    for i, lora_id in enumerate([1, 2, 3, 0, 1, 3]):
        scheduler.add_request(_request(str(i), lora_id))
    with pytest.raises(RequestRejected, match="LoRA adapter id 9"):
        scheduler.add_request(_request("x", 9))
    seen_running = []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        loras = {scheduler.requests[r].lora_id for r in out.num_scheduled_tokens} - {0}
        assert len(loras) <= 2
        seen_running.append(sorted(loras))
        ids = list(out.num_scheduled_tokens)
        stats = scheduler.make_stats()
        assert len(stats.running_lora_adapters) <= 2
        scheduler.update_from_output(out, ModelRunnerOutput(ids, [1] * len(ids)))
    assert seen_running[0] == [1, 2]  # request 2 (adapter 3) waited; the base request and the second 1 did not
    assert [3] in seen_running


def test_prefix_cache_is_keyed_by_adapter():
    from kernelcore.engine.request import Request

    scheduler = _scheduler()
    kv = scheduler.kv
    prompt = list(range(10, 60))
    a, b = Request(_request("a", 1, prompt), 256), Request(_request("b", 2, prompt), 256)
    assert kv.hash_blocks(a) != kv.hash_blocks(b)
    assert kv.hash_blocks(Request(_request("c", 1, prompt), 256)) == kv.hash_blocks(a)


def test_offline_llm_takes_a_lora_request_per_prompt(models):
    from kernelcore import LLM, SamplingParams
    from kernelcore.lora import LoRARequest

    base, adapters = models["llama"]
    llm = LLM(base, enable_lora=True, max_lora_rank=8, kv_cache_memory=1 << 24)
    prompts = [random_tokens(n, seed=n) for n in (19, 23)]
    loras = [LoRARequest("first", 7, adapters[0]), None]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False, lora_request=loras)
    for output, prompt, lora in zip(outputs, prompts, loras, strict=True):
        ours = [entry[t].logprob for entry, t in zip(output.prompt_logprobs[1:], prompt[1:], strict=True)]
        ref = reference_prompt_logprobs(base, lora.path if lora else None, prompt)
        assert ours == pytest.approx(ref, abs=5e-4)
    llm.shutdown()
