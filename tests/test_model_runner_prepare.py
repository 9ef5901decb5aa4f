"""The model runner's decode-only prepare() fast path builds exactly what the general path builds."""

from __future__ import annotations

import random

import pytest
import torch

from kernelcore.executor.model_runner import ModelRunner, SeqBatchEntry


def _runner(block_size: int) -> ModelRunner:
    runner = ModelRunner.__new__(ModelRunner)  # prepare() needs no model
    runner.block_size, runner._arange, runner.lora_manager = block_size, torch.arange(8), None
    return runner


@pytest.mark.parametrize("seed", range(20))
def test_decode_fast_path_matches_the_general_path(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    runner = _runner(block_size)
    entries = []
    for _ in range(rng.randint(1, 40)):
        computed = rng.randint(0, 300)
        needed = computed // block_size + 1
        table = rng.sample(range(1000), needed + rng.randint(0, 3))  # tables may hold spare blocks
        entries.append(SeqBatchEntry(token_ids=[rng.randrange(50000)], num_computed_tokens=computed,
                                     block_table=table))
    fast, general = runner.prepare(entries), runner._prepare_any(entries)
    for a, b in [(fast[0], general[0]), (fast[1], general[1]), (fast[3], general[3])]:
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert fast[4] is None and general[4] is None
    m, g = fast[2], general[2]
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "context_lens", "block_tables"):
        x, y = getattr(m, name), getattr(g, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in ("query_lens_list", "seq_lens_list", "max_query_len", "max_seq_len"):
        assert getattr(m, name) == getattr(g, name), name
    assert m.is_all_decode and m.num_seqs == len(entries)


def test_prefill_or_logprob_rows_take_the_general_path():
    runner = _runner(16)
    entries = [SeqBatchEntry(token_ids=[5], num_computed_tokens=3, block_table=[7]),
               SeqBatchEntry(token_ids=[1, 2], num_computed_tokens=0, block_table=[9])]
    input_ids, positions, metadata, logits_idx, _ = runner.prepare(entries)
    assert input_ids.tolist() == [5, 1, 2] and positions.tolist() == [3, 0, 1]
    assert logits_idx.tolist() == [0, 2] and metadata.query_lens_list == [1, 2]
