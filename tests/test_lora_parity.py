"""kernelcore's logits with PEFT adapters match transformers+peft; base requests in the same batch match the base."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest_models import make_checkpoint, make_llama_checkpoint, make_opt_checkpoint
from lora_helpers import make_peft_adapter, peft_logits
from test_models_parity import BlockAllocator, random_tokens

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    out = {}
    for arch, make in (("llama", make_llama_checkpoint), ("opt", make_opt_checkpoint),
                       ("qwen2", partial(make_checkpoint, "qwen2"))):
        base = make(str(root / arch))
        adapters = [
            make_peft_adapter(base, str(root / f"{arch}-a"), arch, seed=1, rank=8, alpha=16),
            make_peft_adapter(base, str(root / f"{arch}-b"), arch, seed=2, rank=4, alpha=8, use_rslora=True,
                              safe_serialization=False),
            make_peft_adapter(base, str(root / f"{arch}-c"), arch, seed=3, rank=8, alpha=8,
                              targets=["q_proj", "v_proj"]),
        ]
        out[arch] = (base, adapters)
    return out


def make_runner(path: str, max_loras: int, max_cpu_loras: int = 8):
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner

    config = build_config(model=path, block_size=BLOCK_SIZE, enable_lora=True, max_loras=max_loras, max_lora_rank=8,
                          max_cpu_loras=max_cpu_loras)
    runner = ModelRunner(config)
    runner.load_model()
    runner.allocate_kv_cache(64)
    return runner


def run_chunked(runner, seqs: list[list[int]], lora_ids: list[int], chunk: int = 7) -> list[torch.Tensor]:
    """Chunked prefill of every sequence in one mixed batch per step; every position's logits."""
    from kernelcore.executor.model_runner import SeqBatchEntry

    allocator = BlockAllocator(64)
    tables = [[] for _ in seqs]
    done = [0] * len(seqs)
    out = [[] for _ in seqs]
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        entries, owners = [], []
        for i, seq in enumerate(seqs):
            if done[i] < len(seq):
                end = min(done[i] + chunk + i, len(seq))
                entries.append(SeqBatchEntry(seq[done[i]:end], done[i], allocator.cover(tables[i], end),
                                             num_logits=end - done[i], lora_id=lora_ids[i]))
                owners.append(i)
        logits = runner.execute(entries)
        row = 0
        for i, entry in zip(owners, entries, strict=True):
            out[i].append(logits[row:row + entry.num_logits])
            row += entry.num_logits
            done[i] += len(entry.token_ids)
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("arch", ["llama", "opt", "qwen2"])
def test_mixed_batch_matches_peft_and_base(models, arch):
    base, adapters = models[arch]
    runner = make_runner(base, max_loras=3)
    for i, path in enumerate(adapters):
        runner.lora_manager.add_lora(10 + i, path)
    seqs = [random_tokens(n, seed=n) for n in (21, 9, 30, 17)]
    lora_ids = [10, 0, 11, 12]
    ours = run_chunked(runner, seqs, lora_ids)
    refs = [peft_logits(base, adapters[i - 10] if i else None, s) for s, i in zip(seqs, lora_ids, strict=True)]
    base_refs = [peft_logits(base, None, s) for s in seqs]
    for mine, ref, base_ref, lora_id in zip(ours, refs, base_refs, lora_ids, strict=True):
        torch.testing.assert_close(mine, ref, atol=3e-4, rtol=1e-4)
        if lora_id:
            assert (mine - base_ref).abs().max() > 1e-2  # the adapter changes the logits
    # the base request's logits are exactly what a LoRA-free batch gives
    alone = run_chunked(runner, [seqs[1]], [0])[0]
    torch.testing.assert_close(ours[1], alone, atol=1e-5, rtol=1e-5)


def test_slots_are_reused_and_cpu_cache_is_bounded(models):
    base, adapters = models["llama"]
    runner = make_runner(base, max_loras=1, max_cpu_loras=1)
    manager = runner.lora_manager
    for i, path in enumerate(adapters):
        manager.add_lora(10 + i, path)
    seq = random_tokens(12, seed=5)
    for lora_id in (10, 11, 10, 12):  # one slot: each switch reloads it; the CPU cache keeps one adapter
        ours = run_chunked(runner, [seq], [lora_id])[0]
        torch.testing.assert_close(ours, peft_logits(base, adapters[lora_id - 10], seq), atol=3e-4, rtol=1e-4)
        assert manager.slot_ids == [lora_id] and list(manager.cpu_cache) == [lora_id]
    with pytest.raises(RuntimeError, match="max_loras is 1"):
        manager.activate([10, 11])
    manager.remove_lora(12)
    assert manager.slot_ids == [None] and not manager.cpu_cache
