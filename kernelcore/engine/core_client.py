"""Start the engine-core process and talk to it synchronously (the offline LLM's multiprocess mode).

:class:`MPEngineCoreClient` has the surface of :class:`~kernelcore.engine.core.EngineCore` that the
offline API uses (add_request, abort_requests, step, has_unfinished_requests, shutdown), so the
same front-end code drives either.
"""

from __future__ import annotations

import os
from collections import deque

from kernelcore import envs, hostproc
from kernelcore.contract.config import KernelConfig
from kernelcore.engine.core_proc import (
    AbortRequests,
    AddLora,
    AddRequests,
    CoreDead,
    CoreOutputs,
    CoreRequestErrors,
    FromCore,
    LoraAdded,
    ShutdownCore,
)
from kernelcore.engine.outputs import EngineCoreOutputs
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.engine.scheduler import RequestRejected
from kernelcore.hostproc.ipc import Listener, private_socket_dir, remove_private_dir


class EngineDeadError(RuntimeError):
    """The engine-core process (or one of its workers) died; no request can be served."""


class RequestError(RuntimeError):
    """This request failed inside the engine; other requests are unaffected."""


def start_engine_core(config: KernelConfig) -> tuple[hostproc.HostProcess, Listener, dict]:
    """Spawn ``engine-core`` and wait for its ready report; returns (process, listener with its connection
    pending, info)."""
    listener = Listener(os.path.join(private_socket_dir(), "engine-core.sock"))
    p = config.parallel
    role = "engine-core" if p.data_parallel_size == 1 else f"engine-core-dp{p.data_parallel_rank}"
    process = hostproc.spawn("kernelcore.engine.core_proc.run_engine_core", role=role, args=(config, listener.path))
    try:
        info = process.wait_ready(envs.KC_READY_TIMEOUT)
    except BaseException:
        listener.close()
        process.terminate()
        remove_private_dir(os.path.dirname(listener.path))
        raise
    return process, listener, info


class MPEngineCoreClient:
    def __init__(self, config: KernelConfig) -> None:
        self.process, listener, info = start_engine_core(config)
        try:
            self.channel = listener.accept(FromCore, timeout=30)
        finally:
            listener.close()
        self.num_blocks, self.block_size, self.vocab_size = info["num_blocks"], info["block_size"], info["vocab_size"]
        self.private_dir = os.path.dirname(listener.path)
        self.unfinished: set[str] = set()
        self._early: deque = deque()  # messages that arrived while add_lora waited for its answer

    def add_request(self, request: EngineCoreRequest) -> None:
        self.channel.send(AddRequests([request]))
        self.unfinished.add(request.request_id)

    def add_lora(self, lora_id: int, name: str, path: str) -> None:
        """Returns once every worker accepted the adapter; LoRAAdapterError when they refused it."""
        self.channel.send(AddLora(lora_id, name, path))
        while True:
            message = self._recv()
            if isinstance(message, LoraAdded) and message.lora_id == lora_id:
                break
            if isinstance(message, CoreDead):
                raise EngineDeadError(message.message)
            self._early.append(message)
        if message.error is not None:
            from kernelcore.lora.adapter import LoRAAdapterError

            raise LoRAAdapterError(message.error)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.channel.send(AbortRequests(list(request_ids)))
            self.unfinished.difference_update(request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.unfinished)

    def _recv(self):
        while True:
            try:
                return self.channel.recv(timeout=1.0)
            except TimeoutError:
                if not self.process.is_alive():
                    raise EngineDeadError(f"engine core died (exit code {self.process.process.exitcode})") from None
            except (ConnectionError, OSError) as exc:
                raise EngineDeadError(f"engine core is gone: {exc}") from exc

    def step(self) -> EngineCoreOutputs:
        """The next outputs the core produced (it steps on its own while it has work)."""
        while True:
            message = self._early.popleft() if self._early else self._recv()
            if isinstance(message, CoreOutputs):
                for output in message.outputs.outputs:
                    if output.finish_reason is not None:
                        self.unfinished.discard(output.request_id)
                return message.outputs
            if isinstance(message, CoreDead):
                raise EngineDeadError(message.message)
            if isinstance(message, CoreRequestErrors):
                self.unfinished.difference_update(message.errors)
                error = RequestRejected if message.is_rejected else RequestError
                raise error("; ".join(f"{rid}: {msg}" for rid, msg in message.errors.items()))

    def shutdown(self) -> None:
        try:
            self.channel.send(ShutdownCore())
        except OSError:
            pass
        self.process.process.join(10)
        self.process.terminate()
        self.channel.close()
        remove_private_dir(self.private_dir)
