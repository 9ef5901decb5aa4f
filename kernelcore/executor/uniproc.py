"""The in-process executor: one worker (rank 0) in this process."""

from __future__ import annotations

import logging

from kernelcore.contract.config import KernelConfig
from kernelcore.core_types.runner_output import ModelRunnerOutput
from kernelcore.core_types.scheduler_output import SchedulerOutput

logger = logging.getLogger("kernelcore.executor")


def create_worker(config: KernelConfig, rank: int = 0, distributed_init_method: str | None = None):
    """The start-up sequence of every worker: kernel overrides, worker class, device, model, trace, env freeze."""
    from kernelcore import envs, platforms, plugins
    from kernelcore.platforms import resolve_obj_by_qualname

    platforms.load_general_plugins()
    plugins.apply_kernel_overrides()
    worker_cls = resolve_obj_by_qualname(config.parallel.worker_cls)
    worker = worker_cls(config, rank=rank, distributed_init_method=distributed_init_method)
    worker.init_device()
    worker.load_model()
    plugins.trace_kernel_table()
    envs.freeze()
    return worker


class UniProcExecutor:
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.worker = create_worker(config)

    @property
    def block_size(self) -> int:
        return self.config.cache.block_size

    @property
    def vocab_size(self) -> int:
        return self.worker.vocab_size

    def determine_num_blocks(self) -> int:
        return self.worker.determine_num_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def add_lora(self, lora_id: int, path: str) -> None:
        self.worker.add_lora(lora_id, path)

    def remove_lora(self, lora_id: int) -> None:
        self.worker.remove_lora(lora_id)

    def shutdown(self) -> None:
        self.worker = None
