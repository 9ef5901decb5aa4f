"""The multiprocess executor: one spawned ``worker-i`` process per tensor-parallel rank.

The engine core sends each call once per worker over a unix socket (msgspec
frames, no pickle); every rank runs the forward (torch.distributed
collectives inside the parallel layers) and rank 0 returns the sampled tokens.
"""

from __future__ import annotations

import logging
import os
from typing import Union

import msgspec

from kernelcore import envs, hostproc
from kernelcore.config import KernelConfig
from kernelcore.engine.outputs import ModelRunnerOutput, SchedulerOutput
from kernelcore.errors import RequestStateError
from kernelcore.hostproc.ipc import Channel, Listener, private_socket_dir, remove_private_dir

logger = logging.getLogger("kernelcore.executor")


class Call(msgspec.Struct, tag="call"):
    method: str  # "determine_num_blocks" | "initialize_cache" | "vocab_size" | "shutdown"
    arg: int | None = None


class Execute(msgspec.Struct, tag="execute"):
    scheduler_output: SchedulerOutput


class Reply(msgspec.Struct, tag="reply"):
    value: int | None = None
    output: ModelRunnerOutput | None = None
    error: str | None = None
    is_request_error: bool = False  # a RequestStateError: the call failed alone, the worker is consistent


class LoraCall(msgspec.Struct, tag="lora"):
    lora_id: int
    path: str | None = None  # None removes the adapter; each rank reads the directory itself


WorkerRequest = Union[Call, Execute, LoraCall]


class WorkerDiedError(RuntimeError):
    """A worker process died, or failed in a way that may leave the ranks out of step; the engine cannot continue."""


class MultiprocExecutor:
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.world_size = config.parallel.tensor_parallel_size
        self.socket_dir = private_socket_dir()
        # rendezvous through a file in the private directory: no TCP store listening on any interface
        init_method = f"file://{os.path.join(self.socket_dir, 'tp-store')}"
        self.workers: list[hostproc.HostProcess] = []
        self.channels: list[Channel] = []
        listeners = []
        try:
            for rank in range(self.world_size):
                path = os.path.join(self.socket_dir, f"worker-{rank}.sock")
                listeners.append(Listener(path))
                self.workers.append(hostproc.spawn("kernelcore.executor.multiproc.worker_main", role=f"worker-{rank}",
                                                   args=(config.for_rank(rank), rank, init_method, path)))
            for worker in self.workers:
                worker.wait_ready(envs.KC_READY_TIMEOUT)
            for listener in listeners:
                self.channels.append(listener.accept(Reply, timeout=30))
        except BaseException:
            self.shutdown()
            raise
        finally:
            for listener in listeners:
                listener.close()
        self.vocab_size = self._call_all(Call("vocab_size"))[0]

    @property
    def block_size(self) -> int:
        return self.config.cache.block_size

    def _call_all(self, message: WorkerRequest) -> list[int | None]:
        """Every rank's answer; every reply is read before raising, so none is left to answer a later call.

        A RequestStateError on some rank (and nothing worse on any) is raised as one: that call failed alone.
        Any other worker error may leave the ranks out of step, so it is a WorkerDiedError."""
        for rank, channel in enumerate(self.channels):
            self._send(rank, channel, message)
        replies = [self._reply(rank, channel) for rank, channel in enumerate(self.channels)]
        errors = [(rank, reply) for rank, reply in enumerate(replies) if reply.error is not None]
        fatal = [(rank, reply) for rank, reply in errors if not reply.is_request_error]
        if fatal:
            self.check_health()  # a rank that died makes the others fail: name the dead one
            raise WorkerDiedError(f"worker-{fatal[0][0]} failed: {fatal[0][1].error}")
        if errors:
            raise RequestStateError(errors[0][1].error)
        return [reply.value if reply.output is None else reply.output for reply in replies]

    def _send(self, rank: int, channel: Channel, message: WorkerRequest) -> None:
        try:
            channel.send(message)
        except OSError as exc:
            raise WorkerDiedError(f"worker-{rank} is gone: {exc}") from exc

    def _reply(self, rank: int, channel: Channel) -> Reply:
        while True:
            try:
                reply = channel.recv(timeout=1.0)
                break
            except TimeoutError:  # any rank's death: this one may be waiting for it in a collective
                self.check_health()
            except (ConnectionError, OSError) as exc:
                raise WorkerDiedError(f"worker-{rank} is gone: {exc}") from exc
        return reply

    def determine_num_blocks(self) -> int:
        return min(self._call_all(Call("determine_num_blocks")))

    def initialize_cache(self, num_blocks: int) -> None:
        self._call_all(Call("initialize_cache", num_blocks))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._call_all(Execute(scheduler_output))[0]

    def add_lora(self, lora_id: int, path: str) -> None:
        self._call_all(LoraCall(lora_id, path))

    def remove_lora(self, lora_id: int) -> None:
        self._call_all(LoraCall(lora_id))

    def check_health(self) -> None:
        for rank, worker in enumerate(self.workers):
            if not worker.is_alive():
                raise WorkerDiedError(f"worker-{rank} died (exit code {worker.process.exitcode})")

    def shutdown(self) -> None:
        for channel in self.channels:
            try:
                channel.send(Call("shutdown"))
            except OSError:
                pass
        for worker in self.workers:
            worker.process.join(3)
            worker.terminate()
        for channel in self.channels:
            channel.close()
        self.channels, self.workers = [], []
        remove_private_dir(self.socket_dir)


def worker_main(config: KernelConfig, rank: int, init_method: str, socket_path: str) -> None:
    """The target of a ``worker-i`` process (plugins are already loaded by hostproc)."""
    from kernelcore.distributed import shutdown_distributed
    from kernelcore.executor.uniproc import create_worker

    worker = create_worker(config, rank=rank, distributed_init_method=init_method)
    channel = Channel.connect(socket_path, WorkerRequest)
    hostproc.report_ready({"rank": rank})
    while True:
        message = channel.recv()
        try:
            if isinstance(message, Execute):
                output = worker.execute_model(message.scheduler_output)
                channel.send(Reply(output=output if rank == 0 else None))
            elif isinstance(message, LoraCall):
                if message.path is None:
                    worker.remove_lora(message.lora_id)
                else:
                    worker.add_lora(message.lora_id, message.path)
                channel.send(Reply())
            elif message.method == "shutdown":
                break
            elif message.method == "initialize_cache":
                worker.initialize_cache(message.arg)
                channel.send(Reply())
            else:
                channel.send(Reply(value=getattr(worker, message.method)() if message.method != "vocab_size"
                                   else worker.vocab_size))
        except RequestStateError as exc:  # raised before any collective: this rank is still in step
            logger.warning("worker-%d: %s", rank, exc)
            channel.send(Reply(error=str(exc), is_request_error=True))
        except Exception as exc:
            logger.exception("worker-%d failed", rank)
            channel.send(Reply(error=f"{type(exc).__name__}: {exc}"))
    channel.close()
    shutdown_distributed()
