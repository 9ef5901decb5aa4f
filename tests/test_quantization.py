"""--quantization int8: weight-only int8 per output channel, quantized at load.

The reference is transformers run on a *dequantized* copy of the checkpoint (every weight kernelcore quantizes,
replaced by its int8 values times their scale): kernelcore's int8 path must match it like the float path
matches transformers, on OPT and Llama, TP=1 and TP=2, through the prefix cache and with a LoRA adapter.
"""

from __future__ import annotations

import functools
import os
import shutil

import pytest
import torch
from conftest_models import make_llama_checkpoint, make_opt_checkpoint
from lora_helpers import make_peft_adapter

NOT_QUANTIZED = ("embed_tokens", "embed_positions", "norm", "layer_norm")


def dequantized_copy(path: str, out: str) -> str:
    """The checkpoint with every quantized weight replaced by dequantize(quantize_int8(weight))."""
    from safetensors.torch import load_file, save_file

    from kernelcore.layers.linear import quantize_int8_per_channel

    shutil.copytree(path, out)
    file = os.path.join(out, "model.safetensors")
    tensors = load_file(file)
    for name, t in tensors.items():
        if t.dim() == 2 and not any(k in name for k in NOT_QUANTIZED):
            q, scale = quantize_int8_per_channel(t)
            tensors[name] = (q.float() * scale[:, None]).to(t.dtype)
    save_file(tensors, file, metadata={"format": "pt"})
    return out


@functools.lru_cache(maxsize=4)
def hf_model(path: str, adapter: str | None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).eval()
    return model


def hf_logprobs(path: str, tokens: list[int], adapter: str | None = None) -> torch.Tensor:
    model = hf_model(path, adapter)
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    out = {}
    for arch, make in (("llama", make_llama_checkpoint), ("opt", make_opt_checkpoint)):
        base = make(str(root / arch), tie_word_embeddings=False)
        out[arch] = (base, dequantized_copy(base, str(root / f"{arch}-dequantized")))
    return out


def check_against_reference(outputs, prompts, reference: str, adapter: str | None = None) -> None:
    for output, tokens in zip(outputs, prompts, strict=True):
        generated = list(output.outputs[0].token_ids)
        ref = hf_logprobs(reference, tokens + generated, adapter)
        ours = [entry[t].logprob for entry, t in zip(output.prompt_logprobs[1:], tokens[1:], strict=True)]
        expected = ref[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].tolist()
        assert ours == pytest.approx(expected, abs=5e-4)
        # Greedy: each generated token is the reference's argmax at its position.
        assert generated == ref[len(tokens) - 1:-1].argmax(-1).tolist()


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_int8_matches_the_dequantized_reference(models, arch, tp):
    from kernelcore import LLM, SamplingParams

    base, reference = models[arch]
    llm = LLM(base, quantization="int8", tensor_parallel_size=tp, kv_cache_memory=1 << 24, block_size=8)
    prompts = [prompt(n, seed=n) for n in (9, 30)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    check_against_reference(outputs, prompts, reference)
    # Again without prompt logprobs, so the prompts come from the prefix cache: the same greedy tokens.
    first = [list(o.outputs[0].token_ids) for o in outputs]
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], params.clone(prompt_logprobs=None), use_tqdm=False)
    assert all(o.num_cached_tokens >= 8 for o in again)
    assert [list(o.outputs[0].token_ids) for o in again] == first
    llm.shutdown()


def test_lora_on_an_int8_base_matches_peft_on_the_dequantized_base(models, tmp_path):
    from kernelcore import LLM, SamplingParams
    from kernelcore.lora import LoRARequest

    base, reference = models["llama"]
    adapter = make_peft_adapter(reference, str(tmp_path / "adapter"), "llama", seed=3, rank=8, alpha=16)
    llm = LLM(base, quantization="int8", enable_lora=True, max_lora_rank=8, kv_cache_memory=1 << 24)
    prompts = [prompt(17, seed=1)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                           lora_request=[LoRARequest("a", 1, adapter)])
    check_against_reference(outputs, prompts, reference, adapter)
    llm.shutdown()


def test_the_cpu_platform_runs_its_own_methods_and_unknown_names_are_refused():
    from kernelcore.config_builder import build_config
    from kernelcore.quantization import get_quantization_registry

    registry = get_quantization_registry()
    owners = registry.owners()
    assert owners["int8"] == "cpu" and owners["none"] == "cpu"  # the platform's overrides of the core methods
    assert registry.get("int8").__name__ == "CpuInt8LinearMethod"
    with pytest.raises(ValueError, match=r"unknown quantization method 'q4_k'.*int8"):
        build_config(model=None, quantization="q4_k")
    with pytest.raises(ValueError, match="already registered|registered by"):
        registry.register("int8", "x:Y")


def test_int8_weights_are_int8_and_the_lm_head_of_a_tied_model_keeps_the_embedding_float(tmp_path):
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner

    path = make_opt_checkpoint(str(tmp_path / "opt-tied"))  # OPT ties lm_head to embed_tokens by default
    runner = ModelRunner(build_config(model=path, quantization="int8"))
    runner.load_model()
    model = runner.model
    assert model.model.decoder.layers[0].fc1.weight.dtype == torch.int8
    assert model.lm_head.qweight.dtype == torch.int8
    assert model.model.decoder.embed_tokens.weight.dtype == torch.float32


def all_position_logits(path: str, quantization: str | None, seqs: list[list[int]]) -> torch.Tensor:
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner, SeqBatchEntry

    runner = ModelRunner(build_config(model=path, quantization=quantization, block_size=16))
    runner.load_model()
    runner.allocate_kv_cache(8)
    return torch.cat([runner.execute([SeqBatchEntry(s, 0, list(range(8)), num_logits=len(s))]).clone() for s in seqs])


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_int8_quality_vs_fp32_is_bounded(models, arch):
    """KL(p_fp32 || p_int8) and top-1 agreement over 256 positions (benchmarks/quant_quality.py reports the same
    figures for the 125M shape)."""
    base, _ = models[arch]
    seqs = [prompt(64, seed=100 + i) for i in range(4)]
    ref, quant = all_position_logits(base, None, seqs), all_position_logits(base, "int8", seqs)
    ref_logp, logp = ref.log_softmax(-1), quant.log_softmax(-1)
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    top1 = (ref.argmax(-1) == quant.argmax(-1)).float().mean().item()
    print(f"{arch}: mean KL {kl.mean().item():.2e}, max KL {kl.max().item():.2e}, top-1 {top1:.3f}")
    assert kl.shape == (256,)
    # Measured: Llama 1.2e-4 / 3.1e-4 / 96.5%, OPT 4.6e-5 / 1.1e-4 / 98.0% (random weights: near-ties flip argmax).
    assert kl.mean().item() < 1e-3 and kl.max().item() < 3e-3 and top1 >= 0.9


def test_kc_serve_refuses_an_unknown_method_naming_it():
    from helpers import run_kc

    result = run_kc("serve", "--quantization", "q4_k", check=False)
    assert result.returncode == 2 and "unknown quantization method 'q4_k'" in result.stderr


def test_a_vendor_plugin_adds_a_method_through_its_entry_point(models):
    """kc_dummy_ops (a pip-installed test plugin) registers ``dummy_fp16`` in register_quantization_methods."""
    from kernelcore import LLM, SamplingParams
    from kernelcore.quantization import get_quantization_registry

    assert get_quantization_registry().owners()["dummy_fp16"] == "dummy_ops"
    base, _ = models["llama"]
    tokens = prompt(20, seed=7)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    out = {}
    for method in (None, "dummy_fp16"):
        llm = LLM(base, quantization=method, kv_cache_memory=1 << 24)
        [o] = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)
        out[method] = [entry[t].logprob for entry, t in zip(o.prompt_logprobs[1:], tokens[1:], strict=True)]
        if method:
            assert llm.engine_core.executor.worker.model_runner.model.lm_head.weight.dtype == torch.float16
        llm.shutdown()
    assert out["dummy_fp16"] == pytest.approx(out[None], abs=2e-2) and out["dummy_fp16"] != out[None]
