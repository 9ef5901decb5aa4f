"""The CPU platform's KV cache takes memory as tokens are written to it, not at its full size at start-up: its
tensors are private anonymous mappings (the kernel's zero pages), and a mapping's resident bytes are read from
/proc/self/smaps."""

from __future__ import annotations

import os

import pytest
import torch
from conftest_models import make_llama_checkpoint

from builtin_plugins.cpu.allocator import zero_pages_tensor
from kernelcore import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")


def resident_bytes(tensor: torch.Tensor) -> tuple[int, int]:
    """(resident bytes, size) of the mapping that holds ``tensor``'s first element."""
    address = tensor.data_ptr()
    inside = False
    size = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header: start-end perms ...
                start, end = (int(x, 16) for x in fields[0].split("-"))
                inside = start <= address < end
                size = end - start
            elif inside and fields[0] == "Rss:":
                return int(fields[1]) * 1024, size
    raise AssertionError("the tensor's mapping is not in /proc/self/smaps")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_pages_read_as_zeros_and_take_memory_where_written(dtype):
    cache = zero_pages_tensor((2, 4096, 4, 16, 32), dtype)  # 64 or 32 MiB: [K/V, blocks, heads, block size, dim]
    assert cache.shape == (2, 4096, 4, 16, 32) and cache.dtype == dtype and cache.is_contiguous()
    nbytes = cache.numel() * cache.element_size()
    resident, size = resident_bytes(cache)
    assert size >= nbytes and resident <= nbytes // 16  # not written: (next to) nothing resident
    assert not cache[:, :64].any()  # zeros where read (reading takes no memory of its own)
    cache[0, 100:110] = 1.5  # ten blocks of K
    assert resident_bytes(cache)[0] - resident >= 10 * cache[0, 0].numel() * cache.element_size()
    assert resident_bytes(cache)[0] <= nbytes // 8
    assert float(cache[0, 100:110].sum()) == 1.5 * cache[0, 100:110].numel()
    assert not cache[1, 100:110].any()


def test_an_engine_kv_cache_takes_memory_as_it_fills(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "ckpt"), hidden_size=128, intermediate_size=256)
    llm = LLM(path, dtype="float32", kv_cache_memory=256 << 20, block_size=16, max_model_len=256)
    caches = llm.engine_core.executor.worker.model_runner.kv_caches
    nbytes = caches[0].numel() * caches[0].element_size()
    assert nbytes >= 8 << 20  # per layer (max_num_seqs full-length sequences need 16 MiB)
    at_start = [resident_bytes(c)[0] for c in caches]
    assert all(r <= nbytes // 16 for r in at_start)  # start-up wrote (next to) nothing (a torch.zeros: all of it)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5 + i, 17, 33, 101, 9] * 30} for i in range(4)]  # 4 x (150 + 64) tokens
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 64 for o in outputs)
    after = [resident_bytes(c)[0] for c in caches]
    # what 4 x 214 tokens wrote into each layer: K and V of 14 blocks each ([K/V, blocks, ...] on the CPU)
    written = 4 * 14 * 2 * caches[0][0, 0].numel() * caches[0].element_size()
    for start, end in zip(at_start, after, strict=True):
        assert end - start >= written // 2
        assert end <= nbytes // 4
