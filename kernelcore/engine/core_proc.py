"""The engine-core process: EngineCore driven by messages over a unix socket.

Front end -> core: AddRequests, AbortRequests, ShutdownCore, AddLora, RemoveLora.
Core -> front end: CoreOutputs (after every step that produced something),
CoreRequestErrors (a request failed alone), LoraAdded (the answer to AddLora), CoreDead (the engine cannot go on).
All are msgspec Structs (msgpack on the wire): nothing is pickled.
"""

from __future__ import annotations

import logging
import os

import msgspec

from kernelcore import envs, hostproc
from kernelcore.contract.config import KernelConfig
from kernelcore.engine.output_coalescer import OutputCoalescer
from kernelcore.engine.outputs import EngineCoreOutputs
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.errors import WorkerDiedError
from kernelcore.hostproc.ipc import Channel, use_private_root

logger = logging.getLogger("kernelcore.engine")


class AddRequests(msgspec.Struct, tag="add"):
    requests: list[EngineCoreRequest]


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class ShutdownCore(msgspec.Struct, tag="shutdown"):
    pass


class AddLora(msgspec.Struct, tag="add_lora"):
    lora_id: int
    name: str
    path: str  # a local directory the front end validated; workers read it themselves


class RemoveLora(msgspec.Struct, tag="remove_lora"):
    lora_id: int


class CoreOutputs(msgspec.Struct, tag="out"):
    outputs: EngineCoreOutputs


class CoreRequestErrors(msgspec.Struct, tag="err"):
    errors: dict[str, str]  # engine-core request id -> message
    # a client error (admission refused, or the request's own state such as its adapter failed it) rather than
    # a failure of the engine while running it
    is_rejected: bool = False


class LoraAdded(msgspec.Struct, tag="lora_added"):
    lora_id: int
    error: str | None = None  # why the workers refused the adapter (for the client: no paths)


class CoreDead(msgspec.Struct, tag="dead"):
    message: str


ToCore = AddRequests | AbortRequests | ShutdownCore | AddLora | RemoveLora
FromCore = CoreOutputs | CoreRequestErrors | LoraAdded | CoreDead


class EngineCoreLoop:
    def __init__(self, config: KernelConfig, channel: Channel) -> None:
        from kernelcore.engine.core import EngineCore

        self.core = EngineCore(config)
        self.channel = channel
        self.coalescer = OutputCoalescer()
        self.is_running = True

    def handle(self, message: ToCore) -> None:
        if isinstance(message, AddRequests):
            rejected = {}
            for request in message.requests:
                try:
                    self.core.add_request(request)
                except ValueError as exc:
                    rejected[request.request_id] = str(exc)
                else:
                    self.coalescer.add_request(request)
            if rejected:
                self.channel.send(CoreRequestErrors(rejected, is_rejected=True))
        elif isinstance(message, AbortRequests):
            self.core.abort_requests(message.request_ids)
            self.coalescer.forget(message.request_ids)
        elif isinstance(message, AddLora):
            try:
                self.core.add_lora(message.lora_id, message.name, message.path)
            except ValueError as exc:  # the adapter does not fit the model; a dead worker still kills the engine
                logger.error("LoRA adapter %r (%s) not added: %s", message.name, message.path, exc)
                self.channel.send(LoraAdded(message.lora_id, str(exc)))
            else:
                self.channel.send(LoraAdded(message.lora_id))
        elif isinstance(message, RemoveLora):
            self.core.remove_lora(message.lora_id)
        else:
            self.is_running = False

    def info(self) -> dict:
        """What the front end needs to know of this core (its ready report)."""
        return {"num_blocks": self.core.num_blocks, "block_size": self.core.block_size,
                "vocab_size": self.core.vocab_size}

    def has_work(self) -> bool:
        return self.core.has_unfinished_requests() or bool(self.core.scheduler.finished_req_ids)

    def step(self) -> None:
        running = [r.request_id for r in self.core.scheduler.running]
        try:
            outputs = self.core.step()
        except WorkerDiedError:
            raise
        except Exception as exc:
            # The batch failed: fail the requests that were in it, keep serving the rest.
            logger.exception("engine step failed; failing the %d requests it held", len(running))
            self.core.abort_requests(running)
            self.coalescer.forget(running)
            self.channel.send(CoreRequestErrors({rid: f"{type(exc).__name__}: {exc}" for rid in running}))
            return
        to_send = self.coalescer.coalesce(outputs)
        if to_send is None:
            return
        errors, to_send.errors = to_send.errors, {}
        if to_send.outputs or to_send.stats is not None:
            self.channel.send(CoreOutputs(to_send))
        if errors:  # failed alone because of their own state (e.g. an adapter that no longer loads): a client error
            self.channel.send(CoreRequestErrors(errors, is_rejected=True))

    def run(self) -> None:
        while self.is_running:
            busy = self.has_work() or self.coalescer.stats is not None
            for message in self.channel.recv_available(0.0 if busy else 1.0):
                self.handle(message)
            if self.is_running and self.has_work():
                self.step()
            elif self.is_running:
                held = self.coalescer.flush()  # fallen idle: the statistics still held go out now
                if held is not None:
                    self.channel.send(CoreOutputs(held))
                check = getattr(self.core.executor, "check_health", None)
                if check is not None:
                    check()


def run_engine_core(config: KernelConfig, socket_path: str) -> None:
    """The target of the ``engine-core`` process (plugins are already loaded by hostproc)."""
    use_private_root(os.path.dirname(socket_path))  # the front end removes the executor's sockets with its own
    channel = Channel.connect(socket_path, ToCore)
    loop = EngineCoreLoop(config, channel)
    envs.freeze()
    hostproc.report_ready(loop.info())
    serve(loop)


def serve(loop: EngineCoreLoop) -> None:
    """Run the loop until the front end shuts it down or closes the channel; tell it why if the engine fails."""
    try:
        loop.run()
    except ConnectionError:
        logger.info("front end closed the channel; engine core exits")
    except Exception as exc:
        logger.exception("engine core failed")
        try:
            loop.channel.send(CoreDead(f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise
    finally:
        loop.core.shutdown()
