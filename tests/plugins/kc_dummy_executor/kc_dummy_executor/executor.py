"""Runs the one worker in a thread of the engine-core process and logs every call it receives
(JSON lines to $KC_DUMMY_EXECUTOR_LOG), so a test sees that the engine drove it."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

from kernelcore.executor.base import ExecutorBase
from kernelcore.executor.uniproc import create_worker
from kernelcore.hostproc import get_role


class RecordingExecutor(ExecutorBase):
    def __init__(self, config) -> None:
        super().__init__(config)
        if config.parallel.world_size != 1:
            raise ValueError("the recording executor runs exactly one rank")
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="kc-recording-worker")
        self.worker = self._run("create_worker", create_worker, config)

    def _run(self, name, fn, *args):
        path = os.environ.get("KC_DUMMY_EXECUTOR_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"call": name, "role": get_role(), "pid": os.getpid()}) + "\n")
        return self.pool.submit(fn, *args).result()

    @property
    def vocab_size(self) -> int:
        return self.worker.vocab_size

    def determine_num_blocks(self) -> int:
        return self._run("determine_num_blocks", self.worker.determine_num_blocks)

    def initialize_cache(self, num_blocks: int) -> None:
        self._run("initialize_cache", self.worker.initialize_cache, num_blocks)

    def execute_model(self, scheduler_output):
        return self._run("execute_model", self.worker.execute_model, scheduler_output)

    def add_lora(self, lora_id: int, path: str) -> None:
        self._run("add_lora", self.worker.add_lora, lora_id, path)

    def remove_lora(self, lora_id: int) -> None:
        self._run("remove_lora", self.worker.remove_lora, lora_id)

    def shutdown(self) -> None:
        self._run("shutdown", lambda: None)
        self.pool.shutdown()
