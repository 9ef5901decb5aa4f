"""Logits and greedy tokens of the Llama-like architectures (Qwen2/3, Mistral, Phi-3, Gemma 3, Qwen3-MoE, Mixtral) match
transformers on random checkpoints: chunked prefill plus 32 decode steps, and 64 greedy tokens."""

from __future__ import annotations

import pytest
import torch
from conftest_models import make_checkpoint
from test_models_parity import CUSTOM_OPS, check_chunked_prefill_and_decode, check_greedy_matches_generate, make_runner

LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.3, 1.9, 2.5], "long_factor": [1.5, 2.8, 4.0, 7.5]}
GEMMA_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}}
VARIANTS = {
    "qwen2-bias-untied": ("qwen2", {}),
    "qwen2-tied-mha": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "qwen3-qk-norm-tied": ("qwen3", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "qwen3-bias-rope-linear": ("qwen3", {"attention_bias": True,
                                         "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 10000.0}}),
    "mistral-window12": ("mistral", {}),  # a window shorter than most prompts
    "mistral-window12-torch-decode": ("mistral", {}),  # the same through the torch decode path
    # LongRoPE, partial rotary: served within the pretrained length (short factors), and beyond it (long ones)
    "phi3-longrope-short": ("phi3", {"max_position_embeddings": 512, "original_max_position_embeddings": 128,
                                     "rope_parameters": LONGROPE | {"original_max_position_embeddings": 128}}),
    "phi3-longrope-long-tied": ("phi3", {"original_max_position_embeddings": 16, "tie_word_embeddings": True,
                                         "rope_parameters": LONGROPE | {"original_max_position_embeddings": 16}}),
    # local and global layers with their own rope (the global one scaled), q/k norm, a query scale that is not
    # head_dim ** -0.5, soft-capped logits; the window (12) is shorter than the prompts
    "gemma3-interleaved-softcap": ("gemma3", {
        "num_hidden_layers": 3, "sliding_window": 12, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "query_pre_attn_scalar": 24, "final_logit_softcapping": 5.0, "rope_parameters": GEMMA_ROPE}),
    # 8 experts, top-2 renormalised; a dense MLP layer between sparse ones (decoder_sparse_step 2)
    "qwen3moe-norm-topk-sparse-step": ("qwen3_moe", {"norm_topk_prob": True, "decoder_sparse_step": 2,
                                                      "num_hidden_layers": 3, "intermediate_size": 96}),
    "qwen3moe-top3-unnormalised": ("qwen3_moe", {"norm_topk_prob": False, "num_experts_per_tok": 3,
                                                 "tie_word_embeddings": True}),
    # Mixtral: top-2 of 4 experts, always renormalised; a window (12) shorter than the prompts
    "mixtral-top2-window12": ("mixtral", {"sliding_window": 12}),
    "mixtral-top3-of-6-tied": ("mixtral", {"num_local_experts": 6, "num_experts_per_tok": 3,
                                           "tie_word_embeddings": True, "intermediate_size": 48}),
}
RUNNER_KWARGS = {"phi3-longrope-short": {"max_model_len": 128}}
GREEDY_PROMPT_LENS = {"phi3-longrope-long-tied": (17, 24, 30)}  # transformers re-rotates on crossing the length
TORCH_DECODE = {"mistral-window12-torch-decode"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("arch_ckpts")
    return {name: make_checkpoint(arch, str(root / name), **overrides) for name, (arch, overrides) in VARIANTS.items()}


def runner_for(checkpoints, variant: str, ops: list[str]):
    runner = make_runner(checkpoints[variant], ops, **RUNNER_KWARGS.get(variant, {}))
    if variant in TORCH_DECODE:
        for layer in runner.attn_layers:
            layer.impl.native_decode = None
    return runner


# forward_native (custom ops off) only where a variant brings an op path the others do not cover: keeps it fast
NATIVE_TOO = {"qwen3-qk-norm-tied", "mistral-window12", "phi3-longrope-long-tied", "gemma3-interleaved-softcap",
              "qwen3moe-norm-topk-sparse-step"}
CASES = [pytest.param(v, ops, id=f"{v}-{name}") for v in VARIANTS for name, ops in CUSTOM_OPS.items()
         if name == "custom-ops-all" or v in NATIVE_TOO]


@pytest.mark.parametrize("variant,ops", CASES)
def test_chunked_prefill_and_decode_logits_match_transformers(checkpoints, variant, ops):
    check_chunked_prefill_and_decode(checkpoints[variant], ops, runner_for(checkpoints, variant, ops))


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_match_transformers_generate(checkpoints, variant):
    check_greedy_matches_generate(runner_for(checkpoints, variant, ["all"]), checkpoints[variant],
                                  GREEDY_PROMPT_LENS.get(variant, (3, 11, 30)))


def test_sliding_window_engine_frees_blocks_and_matches_generate(checkpoints):
    """The whole engine on Mistral (window 12, blocks of 4): prompts longer than the window, 40 tokens past
    it, greedy tokens equal to transformers, and every block wholly behind a request's window freed."""
    from test_models_parity import load_hf, random_tokens

    from kernelcore.core_types.sampling_params import SamplingParams
    from kernelcore.engine.llm import LLM

    path = checkpoints["mistral-window12"]
    block_bytes = 2 * 2 * 4 * 2 * 16 * 4  # layers * (k, v) * block size * kv heads * head size * fp32
    llm = LLM(path, kv_cache_memory=32 * block_bytes, block_size=4, max_num_batched_tokens=16)
    assert llm.config.cache.sliding_window == 12 and llm.engine_core.num_blocks == 32
    prompts = [random_tokens(n, seed=n) for n in (30, 7, 19)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    hf = load_hf(path)
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()
    kv = llm.engine_core.scheduler.kv
    # A request's last step computes position len + 38 (the 40th token is sampled, never computed): the blocks
    # wholly before its window's first position, len + 38 - 12 + 1, are freed by then.
    assert kv.num_window_freed == sum((len(p) + 38 - 12 + 1) // 4 for p in prompts)
    # 188 tokens of KV in a 128-token cache: the freed blocks were reused, nothing was preempted
    assert sum(len(p) + 40 for p in prompts) > 32 * 4 and llm.engine_core.scheduler.num_preemptions_total == 0
    assert kv.num_free_blocks == kv.num_blocks
    llm.shutdown()


def test_a_backend_without_sliding_window_refuses_the_model(checkpoints, monkeypatch):
    """Never served inexactly: a platform whose attention backend cannot do windows gets a clear error."""
    from builtin_plugins.cpu.attention import CpuAttentionBackend
    from kernelcore.config_builder import build_config
    from kernelcore.layers import attention
    from kernelcore.models.loader import get_model

    class FullOnlyBackend(CpuAttentionBackend):
        supports_sliding_window = False

        @staticmethod
        def get_name() -> str:
            return "FULL_ONLY"

    monkeypatch.setattr(attention, "get_attn_backend", lambda selector: FullOnlyBackend)
    config = build_config(model=checkpoints["mistral-window12"], block_size=16)
    with pytest.raises(ValueError, match=r"sliding-window attention \(window 12 tokens\).*FULL_ONLY.*refusing"):
        get_model(config)


@pytest.mark.parametrize("variant", ["phi3-longrope-short", "qwen3moe-top3-unnormalised", "mixtral-top2-window12"])
def test_lora_on_fused_projection_and_moe_models_is_refused_at_start_up(checkpoints, variant):
    """Phi-3's adapters target its fused qkv/gate_up projections and MoE adapters the experts: neither is mapped,
    so --enable-lora is refused with the architecture's name, never served without the adapters."""
    from kernelcore.config_builder import build_config

    architecture = {"phi3": "Phi3", "qwen3moe": "Qwen3Moe", "mixtral": "Mixtral"}[variant.split("-")[0]]
    with pytest.raises(ValueError, match=rf"{architecture}ForCausalLM \(plugin models\) does not support LoRA"):
        build_config(model=checkpoints[variant], enable_lora=True)


def test_gemma3_attention_soft_capping_is_refused_not_served_inexactly(checkpoints, tmp_path):
    """No attention backend soft-caps scores: a config asking for it is refused at load with the reason."""
    import json
    import os
    import shutil

    from kernelcore.config_builder import build_config
    from kernelcore.models.loader import get_model

    source = checkpoints["gemma3-interleaved-softcap"]
    shutil.copytree(source, tmp_path / "m")
    config = json.load(open(os.path.join(source, "config.json")))
    json.dump({**config, "attn_logit_softcapping": 50.0}, open(tmp_path / "m" / "config.json", "w"))
    with pytest.raises(ValueError, match="attn_logit_softcapping is not supported"):
        get_model(build_config(model=str(tmp_path / "m"), block_size=16))
