"""The multiprocess executor: one spawned ``worker-i`` process per tensor-parallel rank.

The engine core sends each call once per worker over a unix socket (msgspec
frames, no pickle); every rank runs the forward (torch.distributed
collectives inside the parallel layers) and rank 0 returns the sampled tokens.
With ``nnodes > 1`` the ranks of other hosts (``kc serve --headless``) get the
same calls over the head's authenticated cluster port (see ``cluster.py``).
"""

from __future__ import annotations

import logging
import os
from typing import cast

import msgspec

from kernelcore import envs, hostproc
from kernelcore.contract.config import KernelConfig
from kernelcore.core_types.runner_output import ModelRunnerOutput
from kernelcore.core_types.scheduler_output import SchedulerOutput
from kernelcore.errors import RequestStateError
from kernelcore.executor.base import ExecutorBase, WorkerDiedError
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


WorkerRequest = Call | Execute | LoraCall


class MultiprocExecutor(ExecutorBase):
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        parallel = config.parallel
        self.world_size = parallel.world_size
        self.socket_dir = private_socket_dir()
        self.cluster = None
        self.hosts: dict[int, str] = {}  # rank -> the remote host running it
        if parallel.nnodes > 1:  # ranks of other hosts join through the head's authenticated cluster port
            from builtin_plugins.executors.cluster import CLUSTER_SCHEME, ClusterServer

            self.cluster = ClusterServer(config)
            init_method = f"{CLUSTER_SCHEME}{parallel.master_addr}:{parallel.master_port}"
        else:  # rendezvous through a file in the private directory: no TCP store listening on any interface
            init_method = f"file://{os.path.join(self.socket_dir, 'tp-store')}"
        local_ranks = parallel.node_ranks(0)
        self.workers: list[hostproc.HostProcess] = []
        self.channels: list[Channel] = []
        listeners = []
        try:
            for rank in local_ranks:
                path = os.path.join(self.socket_dir, f"worker-{rank}.sock")
                listeners.append(Listener(path))
                self.workers.append(hostproc.spawn("builtin_plugins.executors.multiproc.worker_main",
                                                   role=f"worker-{rank}",
                                                   args=(config.for_rank(rank), rank, init_method, path)))
            if self.cluster is not None:
                self.cluster.wait_for_nodes(envs.KC_READY_TIMEOUT)
            for worker in self.workers:
                worker.wait_ready(envs.KC_READY_TIMEOUT)
            for listener in listeners:
                self.channels.append(listener.accept(Reply, timeout=30))
            for rank in range(len(local_ranks), self.world_size):
                assert self.cluster is not None  # ranks past this host's exist only with nnodes > 1
                channel, self.hosts[rank] = self.cluster.worker_channel(rank, Reply, envs.KC_READY_TIMEOUT)
                self.channels.append(channel)
        except BaseException:
            self.shutdown()
            raise
        finally:
            for listener in listeners:
                listener.close()
        self.vocab_size = self._call_all(Call("vocab_size"))[0]

    @classmethod
    def run_headless(cls, config: KernelConfig) -> int:
        """``kc serve --headless``: run this node's workers for the head until it goes away."""
        from builtin_plugins.executors.headless import run_headless

        return run_headless(config)

    def _name(self, rank: int) -> str:
        return f"worker-{rank}" + (f" on {self.hosts[rank]}" if rank in self.hosts else "")

    @property
    def block_size(self) -> int:
        return self.config.cache.block_size

    def _call_all(self, message: WorkerRequest) -> list:
        """Every rank's answer; every reply is read before raising, so none is left to answer a later call.

        A RequestStateError on some rank (and nothing worse on any) is raised as one: that call failed alone.
        Any other worker error may leave the ranks out of step, so it is a WorkerDiedError."""
        self._send_all(message)
        return self._collect_all()

    def _send_all(self, message: WorkerRequest) -> None:
        for rank, channel in enumerate(self.channels):
            self._send(rank, channel, message)

    def _collect_all(self) -> list:
        """The answers to the oldest call not collected yet (each rank answers its calls in order)."""
        replies = [self._reply(rank, channel) for rank, channel in enumerate(self.channels)]
        errors = [(rank, reply) for rank, reply in enumerate(replies) if reply.error is not None]
        fatal = [(rank, reply) for rank, reply in errors if not reply.is_request_error]
        if fatal:
            self.check_health()  # a collective fails on every rank when one peer dies: name the dead one
            raise WorkerDiedError(f"{self._name(fatal[0][0])} failed: {fatal[0][1].error}")
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
            except TimeoutError:
                self.check_health()  # a rank stuck in a collective with a dead peer never replies
            except (ConnectionError, OSError) as exc:
                raise WorkerDiedError(f"{self._name(rank)} is gone: {exc}") from exc
        return reply

    def determine_num_blocks(self) -> int:
        return min(self._call_all(Call("determine_num_blocks")))

    def initialize_cache(self, num_blocks: int) -> None:
        self._call_all(Call("initialize_cache", num_blocks))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._call_all(Execute(scheduler_output))[self.config.parallel.driver_rank]

    @property
    def max_concurrent_batches(self) -> int:
        """One batch per pipeline stage in flight: stage s runs batch N while stage s+1 runs batch N-1."""
        return self.config.parallel.pipeline_parallel_size

    def submit_model(self, scheduler_output: SchedulerOutput) -> None:
        self._send_all(Execute(scheduler_output))  # every rank queues it behind the batches it is running

    def collect_model(self, handle: None) -> ModelRunnerOutput:
        return self._collect_all()[self.config.parallel.driver_rank]

    def add_lora(self, lora_id: int, path: str) -> None:
        self._call_all(LoraCall(lora_id, path))

    def remove_lora(self, lora_id: int) -> None:
        self._call_all(LoraCall(lora_id))

    def check_health(self) -> None:
        for rank, worker in enumerate(self.workers):
            if not worker.is_alive():
                raise WorkerDiedError(f"worker-{rank} died (exit code {worker.process.exitcode})")
        if self.cluster is not None and self.cluster.lost:
            raise WorkerDiedError(self.cluster.lost)
        for rank in self.hosts:
            if self.channels[rank].is_closed():
                raise WorkerDiedError(f"{self._name(rank)} is gone (its connection closed)")

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
        if self.cluster is not None:
            self.cluster.close()


def worker_main(config: KernelConfig, rank: int, init_method: str, socket_path: str) -> None:
    """The target of a ``worker-i`` process on the head (plugins are already loaded by hostproc)."""
    from kernelcore.executor.uniproc import create_worker

    if init_method.startswith("kc-cluster://"):
        from builtin_plugins.executors.cluster import join_cluster

        join_cluster(config, rank)
    worker = create_worker(config, rank=rank, distributed_init_method=init_method)
    channel = Channel.connect(socket_path, WorkerRequest)
    hostproc.report_ready({"rank": rank})
    serve_worker(worker, channel, rank)


def remote_worker_main(config: KernelConfig, rank: int) -> None:
    """The target of a ``worker-i`` process on a headless node: the same worker, driven over the cluster port."""
    from builtin_plugins.executors.cluster import join_cluster
    from kernelcore.executor.uniproc import create_worker
    from kernelcore.hostproc.tcp import connect_authenticated

    join_cluster(config, rank)
    worker = create_worker(config, rank=rank)
    p = config.parallel
    sock = connect_authenticated(cast(str, p.master_addr), cast(int, p.master_port), cast(str, p.cluster_secret),
                                 {"kind": "worker", "rank": rank, "node_rank": p.node_rank})
    hostproc.report_ready({"rank": rank})
    serve_worker(worker, Channel(sock, WorkerRequest), rank)


def serve_worker(worker, channel: Channel, rank: int) -> None:
    """Answer the engine core's calls until it says shutdown (or the channel closes)."""
    from kernelcore.distributed import shutdown_distributed

    while True:
        reply = handle_call(worker, channel.recv(), rank)
        if reply is None:
            break
        channel.send(reply)
    channel.close()
    shutdown_distributed()


def handle_call(worker, message: WorkerRequest, rank: int) -> Reply | None:
    """Run one call on this rank's worker; None for shutdown. Errors come back in the reply."""
    try:
        if isinstance(message, Execute):
            return Reply(output=worker.execute_model(message.scheduler_output))  # None except on the driver rank
        if isinstance(message, LoraCall):
            if message.path is None:
                worker.remove_lora(message.lora_id)
            else:
                worker.add_lora(message.lora_id, message.path)
            return Reply()
        if message.method == "shutdown":
            return None
        if message.method == "initialize_cache":
            worker.initialize_cache(message.arg)
            return Reply()
        if message.method == "vocab_size":
            return Reply(value=worker.vocab_size)
        return Reply(value=getattr(worker, message.method)())
    except RequestStateError as exc:  # raised before any collective: this rank is still in step
        logger.warning("worker-%d: %s", rank, exc)
        return Reply(error=str(exc), is_request_error=True)
    except Exception as exc:
        logger.exception("worker-%d failed", rank)
        return Reply(error=f"{type(exc).__name__}: {exc}")
