"""Logits and greedy tokens of kernelcore's OPT and Llama match transformers on random checkpoints (the checks
are shared with test_models_arch_parity.py)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest_models import make_llama_checkpoint, make_opt_checkpoint

BLOCK_SIZE = 16
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
VARIANTS = {
    "llama-gqa": (make_llama_checkpoint, {}),
    "llama-mha-tied": (make_llama_checkpoint, {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama-rope-llama3": (make_llama_checkpoint, {"rope_scaling": LLAMA3_ROPE, "num_key_value_heads": 1}),
    "llama-rope-linear": (make_llama_checkpoint, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "opt-pre-norm": (make_opt_checkpoint, {}),
    "opt-post-norm-proj": (make_opt_checkpoint, {"do_layer_norm_before": False, "word_embed_proj_dim": 32,
                                                 "tie_word_embeddings": False}),
}
CUSTOM_OPS = {"custom-ops-all": ["all"], "custom-ops-none": ["none"]}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {name: make(str(root / name), **overrides) for name, (make, overrides) in VARIANTS.items()}


class BlockAllocator:
    """Hands out scattered block ids so block tables are never contiguous."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def cover(self, table: list[int], num_tokens: int) -> list[int]:
        while len(table) * BLOCK_SIZE < num_tokens:
            table.append(self.free.pop())
        return table


def make_runner(path: str, custom_ops: list[str], num_blocks: int = 64, dtype: str = "float32", runner_cls=None,
                **config_kwargs):
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner

    config = build_config(model=path, dtype=dtype, block_size=BLOCK_SIZE, custom_ops=list(custom_ops), **config_kwargs)
    runner = (runner_cls or ModelRunner)(config)
    runner.load_model()
    runner.allocate_kv_cache(num_blocks)
    return runner


def load_hf(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def random_tokens(n: int, seed: int, vocab: int = 320) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize("ops", CUSTOM_OPS.values(), ids=CUSTOM_OPS.keys())
@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_prefill_and_decode_logits_match_transformers(checkpoints, variant, ops):
    check_chunked_prefill_and_decode(checkpoints[variant], ops)


def check_chunked_prefill_and_decode(path: str, ops: list[str], runner=None, atol: float = 2e-4) -> None:
    """Three staggered sequences, prefilled in chunks while the others decode, 32 decode steps each: every
    position's logits equal transformers' full-sequence forward."""
    from kernelcore.executor.model_runner import SeqBatchEntry

    runner = runner or make_runner(path, ops)
    expected_method = "forward_native" if ops == ["none"] else "forward_cpu"
    norms = [m for m in runner.model.modules() if type(m).__name__ in ("RMSNorm", "LayerNorm", "GemmaRMSNorm")]
    assert norms and all(m.forward_method_name == expected_method for m in norms)
    hf = load_hf(path)
    prompt_lens, chunk_sizes, num_decode = [5, 23, 40], [7, 16, 9], 32
    seqs = [random_tokens(n + num_decode, seed=i) for i, n in enumerate(prompt_lens)]
    with torch.no_grad():
        refs = [hf(torch.tensor([s])).logits[0] for s in seqs]
    allocator = BlockAllocator(64)
    tables = [[] for _ in seqs]
    num_computed = [0] * len(seqs)
    step = 0
    while any(c < len(s) for c, s in zip(num_computed, seqs, strict=True)):
        entries, owners = [], []
        for i, seq in enumerate(seqs):
            if i > step or num_computed[i] >= len(seq):  # staggered starts: decodes mix with prefill chunks
                continue
            start = num_computed[i]
            end = min(start + chunk_sizes[i], prompt_lens[i]) if start < prompt_lens[i] else start + 1
            entries.append(SeqBatchEntry(seq[start:end], start, allocator.cover(tables[i], end),
                                         num_logits=end - start))
            owners.append(i)
        logits = runner.execute(entries)
        assert logits.dtype == torch.float32 and logits.shape == (sum(e.num_logits for e in entries), runner.vocab_size)
        row = 0
        for i, entry in zip(owners, entries, strict=True):
            start, n = entry.num_computed_tokens, len(entry.token_ids)
            torch.testing.assert_close(logits[row:row + n], refs[i][start:start + n], atol=atol, rtol=1e-4)
            row += n
            num_computed[i] += n
        step += 1


def greedy_kernelcore(runner, prompts: list[list[int]], max_new_tokens: int, chunk: int = 8) -> list[list[int]]:
    from kernelcore.executor.model_runner import SeqBatchEntry

    allocator = BlockAllocator(64, seed=1)
    tables = [[] for _ in prompts]
    tokens = [list(p) for p in prompts]
    num_computed = [0] * len(prompts)
    while any(len(t) - len(p) < max_new_tokens for t, p in zip(tokens, prompts, strict=True)):
        entries, owners = [], []
        for i, seq in enumerate(tokens):
            if len(seq) - len(prompts[i]) >= max_new_tokens:
                continue
            start = num_computed[i]
            end = min(start + chunk, len(seq))
            entries.append(SeqBatchEntry(seq[start:end], start, allocator.cover(tables[i], end),
                                         num_logits=1 if end == len(seq) else 0))
            owners.append(i)
        logits = runner.execute(entries)
        next_tokens = logits.argmax(-1).tolist()
        for i, entry in zip(owners, entries, strict=True):
            num_computed[i] += len(entry.token_ids)
            if entry.num_logits:
                tokens[i].append(next_tokens.pop(0))
        assert not next_tokens
    return [t[len(p):] for t, p in zip(tokens, prompts, strict=True)]


@pytest.mark.parametrize("ops", CUSTOM_OPS.values(), ids=CUSTOM_OPS.keys())
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_match_transformers_generate(checkpoints, variant, ops):
    check_greedy_matches_generate(make_runner(checkpoints[variant], ops), checkpoints[variant])


def check_greedy_matches_generate(runner, path: str, prompt_lens=(3, 11, 30)) -> None:
    """64 greedy tokens after prompts of 3, 11 and 30 tokens equal transformers' ``generate``."""
    hf = load_hf(path)
    prompts = [random_tokens(n, seed=10 + n) for n in prompt_lens]
    ours = greedy_kernelcore(runner, prompts, max_new_tokens=64)
    eos = hf.config.eos_token_id
    for prompt, got in zip(prompts, ours, strict=True):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=64, do_sample=False, pad_token_id=eos)
        expected = out[0, len(prompt):].tolist()
        assert got[:len(expected)] == expected
        assert len(expected) == 64 or expected[-1] == eos  # transformers stops at eos; kernelcore keeps going
