"""The GPU worker: the model, its inputs and the paged KV cache on cuda:<rank>; NCCL between ranks.

The KV-cache budget is measured here, after the weights are on the device: the free memory less a
headroom for activations, unless the user set ``cache.kv_cache_memory`` (then at most the free memory).
Decode batches replay CUDA graphs (builtin_plugins/cuda/graphs.py) unless ``enforce_eager`` is set.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from kernelcore.contract.config import CacheConfig
from kernelcore.distributed import init_distributed
from kernelcore.executor.model_runner import ModelRunner
from kernelcore.executor.worker import WorkerBase

logger = logging.getLogger("kernelcore.cuda")

DEFAULT_KV_CACHE_MEMORY = CacheConfig.__dataclass_fields__["kv_cache_memory"].default
HEADROOM_FRACTION = 0.1  # of the device's memory, kept free for activations and the allocator


class CudaModelRunner(ModelRunner):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config)
        self.device = device

    def load_model(self, is_dummy: bool = False) -> None:
        super().load_model(is_dummy)  # built and loaded on the host, then moved in one go
        self.model.to(self.device)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        with torch.device(self.device):
            super().allocate_kv_cache(num_blocks)

    def prepare(self, entries):
        input_ids, positions, metadata, logits_idx, lora_ids = super().prepare(entries)
        to = lambda t: None if t is None else t.to(self.device, non_blocking=True)  # noqa: E731
        metadata = dataclasses.replace(
            metadata, slot_mapping=to(metadata.slot_mapping), query_start_loc=to(metadata.query_start_loc),
            seq_lens=to(metadata.seq_lens), context_lens=to(metadata.context_lens),
            block_tables=to(metadata.block_tables))
        return to(input_ids), to(positions), metadata, to(logits_idx), to(lora_ids)

    def execute(self, entries):
        logits = super().execute(entries)
        return None if logits is None else logits.cpu()  # the sampler runs on the host


class CudaWorker(WorkerBase):
    def init_device(self) -> None:
        from builtin_plugins.cuda.platform import require_triton

        require_triton()
        if not torch.cuda.is_available():
            raise RuntimeError("the CUDA platform was detected, but torch sees no GPU (a CPU-only torch build?)")
        self.device = torch.device("cuda", self.rank % torch.cuda.device_count())
        torch.cuda.set_device(self.device)
        super().init_device()
        init_distributed(self.config.parallel.world_size, self.rank, self.distributed_init_method, "nccl",
                         tensor_parallel_size=self.config.parallel.tensor_parallel_size)

    def load_model(self) -> None:
        self.model_runner = CudaModelRunner(self.config, self.device)
        self.model_runner.load_model()

    def determine_num_blocks(self) -> int:
        cache = self.config.cache
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        available = int(free - HEADROOM_FRACTION * total)
        if cache.kv_cache_memory == DEFAULT_KV_CACHE_MEMORY:
            cache.kv_cache_memory = available
        elif cache.kv_cache_memory > available:
            raise ValueError(f"kv_cache_memory={cache.kv_cache_memory} bytes, but only {available} are free on "
                             f"{self.device} after the weights")
        num_blocks = super().determine_num_blocks()
        logger.info("KV cache on %s: %d blocks (%.2f GiB free of %.2f GiB)", self.device, num_blocks, free / 2**30,
                    total / 2**30)
        return num_blocks
