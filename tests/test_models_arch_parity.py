"""Logits and greedy tokens of the Llama-like architectures (Qwen2/3, Mistral, Phi-3, Gemma 3, MoE) match
transformers on random checkpoints: chunked prefill plus 32 decode steps, and 64 greedy tokens."""

from __future__ import annotations

import pytest
import torch

from conftest_models import make_checkpoint
from test_models_parity import (CUSTOM_OPS, check_chunked_prefill_and_decode, check_greedy_matches_generate,
                                make_runner)

VARIANTS = {
    "qwen2-bias-untied": ("qwen2", {}),
    "qwen2-tied-mha": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "qwen3-qk-norm-tied": ("qwen3", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "qwen3-bias-rope-linear": ("qwen3", {"attention_bias": True,
                                         "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 10000.0}}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("arch_ckpts")
    return {name: make_checkpoint(arch, str(root / name), **overrides) for name, (arch, overrides) in VARIANTS.items()}


def _ops(variant: str) -> list[list[str]]:
    return list(CUSTOM_OPS.values())


@pytest.mark.parametrize("ops", CUSTOM_OPS.values(), ids=CUSTOM_OPS.keys())
@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_prefill_and_decode_logits_match_transformers(checkpoints, variant, ops):
    check_chunked_prefill_and_decode(checkpoints[variant], ops)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_match_transformers_generate(checkpoints, variant):
    check_greedy_matches_generate(make_runner(checkpoints[variant], ["all"]), checkpoints[variant])
