"""Tensor-parallel layers: two gloo ranks produce the single-rank logits (sharded loading, all-reduce, gather)."""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch.multiprocessing as mp
from conftest_models import make_checkpoint, make_llama_checkpoint, make_opt_checkpoint

pytestmark = pytest.mark.slow  # spawns tensor-parallel ranks

PROMPTS = [[5, 9, 11, 3, 7, 8, 100, 200, 17],
           [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58]]


def run_steps(path: str) -> torch.Tensor:
    """Prefill two prompts, then 4 greedy decode steps; all logits rows stacked."""
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner, SeqBatchEntry

    runner = ModelRunner(build_config(model=path, dtype="float32", block_size=16))
    runner.load_model()
    runner.allocate_kv_cache(8)
    tables = [[0, 1], [2, 3]]
    logits = runner.execute([SeqBatchEntry(p, 0, t, num_logits=len(p)) for p, t in zip(PROMPTS, tables, strict=True)])
    rows, lens = [logits], [len(p) for p in PROMPTS]
    next_tokens = [logits[len(PROMPTS[0]) - 1].argmax().item(), logits[-1].argmax().item()]
    for _ in range(4):
        logits = runner.execute([SeqBatchEntry([tok], n, t)
                                 for tok, n, t in zip(next_tokens, lens, tables, strict=True)])
        rows.append(logits)
        next_tokens, lens = logits.argmax(-1).tolist(), [n + 1 for n in lens]
    return torch.cat(rows)


def gloo_threads() -> list[str]:
    """This process's gloo threads, by name (Linux's /proc; empty elsewhere)."""
    names = []
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return [n for n in names if "gloo" in n]


def _worker(rank: int, world_size: int, store: str, path: str, out: str) -> None:
    import torch.distributed as dist

    from kernelcore.distributed import (
        TorchDistCommunicator,
        get_tp_group,
        init_distributed,
        make_device_communicator,
        set_tp_group,
    )

    torch.set_num_threads(1)
    init_distributed(world_size, rank, f"file://{store}", "gloo")  # as the CPU worker joins its group
    comm = make_device_communicator()  # the CPU platform names TorchDistCommunicator
    assert isinstance(comm, TorchDistCommunicator) and comm.world_size == world_size
    set_tp_group(comm)
    try:
        logits = run_steps(path)
        if rank == 0:
            torch.save(logits, out)
        dist.barrier()  # no rank tears its group down while another still talks to it
    finally:
        set_tp_group(None)
        dist.destroy_process_group()
    assert get_tp_group().world_size == 1
    # Nothing may keep the group alive past destroy_process_group: its gloo threads would die with the
    # interpreter and abort the rank at exit (a default argument captured group.WORLD once, see
    # kernelcore.distributed.prepare_process_group).
    gc.collect()
    assert gloo_threads() == []


TP_VARIANTS = {
    "qwen3-bias-qk-norm-kv1": ("qwen3", {"attention_bias": True, "num_key_value_heads": 1, "vocab_size": 321}),
    # every expert's intermediate dimension split over the ranks, a dense layer between sparse ones
    "qwen3moe-experts-split": ("qwen3_moe", {"norm_topk_prob": True, "decoder_sparse_step": 2, "num_hidden_layers": 3}),
    # top-2 of 4 experts, each split over the ranks; a window (12) shorter than the second prompt
    "mixtral-experts-split-window12": ("mixtral", {"sliding_window": 12}),
    "mistral-window12": ("mistral", {"vocab_size": 321}),
    # fused qkv / gate_up in the checkpoint, split per rank at load; partial rotary with LongRoPE
    "phi3-fused-longrope": ("phi3", {"original_max_position_embeddings": 16,
                                     "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                         "partial_rotary_factor": 0.5,
                                                         "short_factor": [1.0, 1.3, 1.9, 2.5],
                                                         "long_factor": [1.5, 2.8, 4.0, 7.5],
                                                         "original_max_position_embeddings": 16}}),
    # local and global layers, q/k norm, scaled embeddings, soft-capped logits
    "gemma3-interleaved-softcap": ("gemma3", {"num_hidden_layers": 3, "sliding_window": 12, "tie_word_embeddings": True,
                                              "layer_types": ["sliding_attention", "full_attention",
                                                              "sliding_attention"],
                                              "query_pre_attn_scalar": 24, "final_logit_softcapping": 5.0}),
}


@pytest.mark.parametrize("variant", ["llama-kv1-odd-vocab-tied", "opt-post-norm-proj", *TP_VARIANTS])
def test_two_ranks_match_one_rank(tmp_path, variant):
    if variant in TP_VARIANTS:
        arch, overrides = TP_VARIANTS[variant]
        path = make_checkpoint(arch, str(tmp_path / "m"), **overrides)
    elif variant.startswith("llama"):
        path = make_llama_checkpoint(str(tmp_path / "m"), num_key_value_heads=1, vocab_size=321,
                                     tie_word_embeddings=True)
    else:
        path = make_opt_checkpoint(str(tmp_path / "m"), do_layer_norm_before=False, word_embed_proj_dim=32,
                                   vocab_size=321)
    out = str(tmp_path / "tp2.pt")
    mp.start_processes(_worker, args=(2, str(tmp_path / "store"), path, out), nprocs=2, join=True, start_method="spawn")
    expected = run_steps(path)
    torch.testing.assert_close(torch.load(out), expected, atol=2e-4, rtol=1e-4)
