"""The CPU platform's model runner: low-precision decode logits land in a float32 buffer reused across steps; the
KV cache is mapped zero pages (2 MiB ones where the kernel gives them) that take memory once written."""

from __future__ import annotations

import torch

from builtin_plugins.cpu.allocator import zero_pages_tensor
from kernelcore import envs
from kernelcore.executor.model_runner import ModelRunner


class CpuModelRunner(ModelRunner):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._logits_buffer = torch.empty(0)
        self.max_buffered_logits = config.scheduler.max_num_seqs  # rows: one per sequence in a decode step

    def new_kv_cache(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return zero_pages_tensor(shape, dtype, huge_pages=bool(envs.KC_CPU_HUGE_PAGES))

    def logits_to_float32(self, logits: torch.Tensor) -> torch.Tensor:
        num_rows = logits.shape[0]
        if logits.dtype == torch.float32 or num_rows > self.max_buffered_logits:
            return super().logits_to_float32(logits)
        # A fresh float32 tensor is a new mmap (tens of MB at large batches) page-faulted in on every step.
        # The buffer is valid until the next execute().
        if self._logits_buffer.shape[0] < num_rows:
            self._logits_buffer = torch.empty(num_rows, self.vocab_size, dtype=torch.float32)
        out = self._logits_buffer[:num_rows]
        out.copy_(logits[:, : self.vocab_size])
        return out
