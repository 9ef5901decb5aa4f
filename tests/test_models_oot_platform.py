"""The third dispatch path: the same models through the vendor (out-of-tree) platform, ops on forward_oot."""

import json

import pytest
from helpers import run_python

pytestmark = pytest.mark.slow  # spawns engines on the vendor's platform


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_oot_platform_gives_transformers_logits_and_greedy_tokens(family, tmp_path):
    from conftest_models import make_llama_checkpoint, make_opt_checkpoint

    path = (make_llama_checkpoint if family == "llama" else make_opt_checkpoint)(str(tmp_path / family))
    out = run_python(f"""
        import json, torch
        from transformers import AutoModelForCausalLM
        from kernelcore import LLM, SamplingParams
        from kernelcore.platforms import current_platform
        llm = LLM({path!r}, kv_cache_memory=4 << 20, block_size=16, max_num_batched_tokens=16)
        hf = AutoModelForCausalLM.from_pretrained({path!r}).eval()
        prompts = [[1, 5, 9, 13, 200, 7], list(range(3, 40))]
        outs = llm.generate([{{"prompt_token_ids": p}} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0,
                                           prompt_logprobs=0),
                            use_tqdm=False)
        same_tokens, max_diff = True, 0.0
        for p, o in zip(prompts, outs):
            ref = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
            same_tokens &= o.outputs[0].token_ids == ref[0, len(p):].tolist()
            with torch.no_grad():
                ref_lp = hf(torch.tensor([p])).logits[0].log_softmax(-1)
            for i, entry in enumerate(o.prompt_logprobs[1:]):
                max_diff = max(max_diff, abs(entry[p[i + 1]].logprob - ref_lp[i, p[i + 1]].item()))
        ops = {{type(m).__name__: m.forward_method_name
               for m in llm.engine_core.executor.worker.model_runner.model.modules()
               if hasattr(m, "forward_method_name")}}
        print(json.dumps(dict(platform=current_platform.device_name, same=same_tokens, diff=max_diff, ops=ops)))
    """, KC_DUMMY_DEVICE="1")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["platform"] == "DummyDevice"
    assert result["same"] and result["diff"] < 1e-4
    assert result["ops"] and set(result["ops"].values()) == {"forward_oot"}
    if family == "llama":
        assert "DummyRotaryEmbedding" in result["ops"]  # the vendor's replacement was built and used
