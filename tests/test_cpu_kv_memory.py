"""The CPU platform's KV cache takes memory as tokens are written to it, not at its full size at start-up: its
tensors are private anonymous mappings (the kernel's zero pages), and a tensor's resident bytes are read from
/proc/self/pagemap."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest_models import make_llama_checkpoint

from builtin_plugins.cpu.allocator import zero_pages_tensor
from kernelcore import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux /proc")


def resident_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` in pages of this process's own (written) memory, from /proc/self/pagemap: present
    (bit 63) and mapped by this process alone (bit 56), which the shared zero page behind an unwritten read is
    not. (Per tensor: the kernel merges neighbouring mappings, so /proc/self/smaps cannot tell layers apart.)"""
    page = os.sysconf("SC_PAGE_SIZE")
    first, end = tensor.data_ptr() // page, -(-(tensor.data_ptr() + tensor.nbytes) // page)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((end - first) * 8), dtype=np.uint64)
    owned = ((entries >> np.uint64(63)) & np.uint64(1)) & ((entries >> np.uint64(56)) & np.uint64(1))
    return int(owned.sum()) * page


@pytest.mark.parametrize("huge_pages", [False, True], ids=["4k", "huge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_pages_read_as_zeros_and_take_memory_where_written(dtype, huge_pages):
    # 64 or 32 MiB: [K/V, blocks, heads, block size, dim]
    cache = zero_pages_tensor((2, 4096, 4, 16, 32), dtype, huge_pages=huge_pages)
    assert cache.shape == (2, 4096, 4, 16, 32) and cache.dtype == dtype and cache.is_contiguous()
    if huge_pages:
        assert cache.data_ptr() % (2 << 20) == 0  # where the kernel may back it with 2 MiB pages
    assert resident_bytes(cache) == 0  # not written: nothing resident
    assert not cache[:, :64].any()  # zeros where read
    assert resident_bytes(cache) == 0  # (reading took no memory of its own)
    cache[0, 100:110] = 1.5  # ten blocks of K
    assert 10 * cache[0, 0].numel() * cache.element_size() <= resident_bytes(cache) <= 4 << 20
    assert float(cache[0, 100:110].sum()) == 1.5 * cache[0, 100:110].numel()
    assert not cache[1, 100:110].any()


def test_an_engine_kv_cache_takes_memory_as_it_fills(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "ckpt"), hidden_size=128, intermediate_size=256)
    # 1024 sequences of 256 tokens need the whole 256 MiB: 128 per layer (huge pages, where given, make the
    # first touches of each layer's K and V, and its spare block, 2 MiB each)
    llm = LLM(path, dtype="float32", kv_cache_memory=256 << 20, block_size=16, max_model_len=256, max_num_seqs=1024)
    caches = llm.engine_core.executor.worker.model_runner.kv_caches
    nbytes = caches[0].numel() * caches[0].element_size()
    assert nbytes >= 64 << 20
    at_start = [resident_bytes(c) for c in caches]
    assert all(r <= nbytes // 16 for r in at_start)  # start-up wrote (next to) nothing (a torch.zeros: all of it)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5 + i, 17, 33, 101, 9] * 30} for i in range(4)]  # 4 x (150 + 64) tokens
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 64 for o in outputs)
    after = [resident_bytes(c) for c in caches]
    # what 4 x 214 tokens wrote into each layer: K and V of 14 blocks each ([K/V, blocks, ...] on the CPU)
    written = 4 * 14 * 2 * caches[0][0, 0].numel() * caches[0].element_size()
    for start, end in zip(at_start, after, strict=True):
        assert end - start >= written // 2
        assert end <= nbytes // 4


def test_a_kv_cache_dtype_the_backend_does_not_list_is_refused():
    from kernelcore.config import KernelConfig
    from kernelcore.executor.model_runner import ModelRunner

    class Backend:
        supported_kv_cache_dtypes = ("bfloat16",)

        @staticmethod
        def get_name():
            return "NOVA"

    runner = ModelRunner.__new__(ModelRunner)
    runner.config, runner.dtype = KernelConfig(), torch.float32
    runner.attn_layers = [type("Layer", (), {"backend": Backend})()]
    for name, dtype in (("auto", torch.float32), ("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        runner.config.cache.kv_cache_dtype = name
        assert runner.kv_cache_dtype == dtype
    runner.config.cache.kv_cache_dtype = "float16"
    with pytest.raises(ValueError, match="NOVA"):
        runner.kv_cache_dtype  # noqa: B018
