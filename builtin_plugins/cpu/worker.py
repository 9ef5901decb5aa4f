"""The CPU platform's worker."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from builtin_plugins.cpu.allocator import keep_freed_memory, release_freed_memory
from builtin_plugins.cpu.hugepages import move_weights_to_huge_pages
from builtin_plugins.cpu.linear import prepack_linears
from builtin_plugins.cpu.linear_tuning import tune_linears
from kernelcore import envs
from kernelcore.distributed import init_distributed
from kernelcore.executor.worker import WorkerBase


class CpuWorker(WorkerBase):
    thread_policy = None

    def execute_model(self, so):
        if self.thread_policy is None or not so.num_scheduled_tokens:
            return super().execute_model(so)
        self.thread_policy.update()
        try:
            return super().execute_model(so)
        finally:
            self.thread_policy.step_finished()

    def load_model(self) -> None:
        from builtin_plugins.cpu.model_runner import CpuModelRunner

        runner = CpuModelRunner(self.config)
        runner.load_model()
        if envs.KC_CPU_HUGE_PAGES:
            move_weights_to_huge_pages(runner.model)
        prepack_linears(runner.model)
        if envs.KC_CPU_TUNE_LINEARS:
            tune_linears(runner.model, self.config.scheduler.max_num_batched_tokens,
                         cache_dir=Path(envs.KC_CACHE_DIR) / "cpu-linear-tuning")
        release_freed_memory()  # the loader's freed buffers, before the first forward allocates its activations
        self.model_runner = runner
        if self.thread_policy is not None:
            self.thread_policy.follow_during(runner.model)

    def init_device(self) -> None:
        if envs.KC_CPU_KEEP_FREED_MEMORY:
            keep_freed_memory()
        super().init_device()
        num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        parallel = self.config.parallel
        # The ranks sharing this host's cores.
        ranks_here = parallel.world_size * len(parallel.data_parallel_local_ranks) // parallel.nnodes
        torch.set_num_threads(parallel.num_threads or max(1, num_cores // ranks_here))
        # One worker process on the host: its threads follow the cores other programs leave free. (Several
        # ranks or replicas here would count each other as the load.)
        self.thread_policy = None
        if envs.KC_CPU_FOLLOW_FREE_CORES and ranks_here == 1:
            from builtin_plugins.cpu.thread_policy import ThreadPolicy

            self.thread_policy = ThreadPolicy(torch.get_num_threads())
        init_distributed(parallel.world_size, self.rank, self.distributed_init_method, "gloo",
                         tensor_parallel_size=parallel.tensor_parallel_size)
