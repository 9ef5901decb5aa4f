"""The Ray actors of the ``ray`` executor: a rank's worker, and the ranks' rendezvous store."""

from __future__ import annotations

import asyncio

import msgspec
import ray
import torch.distributed as dist


@ray.remote
class StoreActor:
    """The key-value table torch.distributed's ranks exchange their endpoints through (async: get waits)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = asyncio.Condition()

    async def set(self, key: str, value: bytes) -> None:
        async with self.changed:
            self.data[key] = value
            self.changed.notify_all()

    async def get(self, key: str, timeout: float) -> bytes:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: key in self.data), timeout)
            return self.data[key]

    async def add(self, key: str, amount: int) -> int:
        async with self.changed:
            number = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(number).encode()
            self.changed.notify_all()
            return number

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        async with self.changed:
            current = self.data.get(key)
            if (current is None and not expected) or current == expected:
                self.data[key] = current = desired
                self.changed.notify_all()
            return expected if current is None else current

    async def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    async def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None

    async def num_keys(self) -> int:
        return len(self.data)


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else bytes(value) if isinstance(value, (bytearray, list)) \
        else str(value).encode()


class RayStore(dist.Store):
    def __init__(self, actor, timeout: float = 300.0) -> None:
        super().__init__()
        self.actor, self.wait_timeout = actor, timeout

    def set(self, key, value) -> None:
        ray.get(self.actor.set.remote(key, _bytes(value)))

    def get(self, key) -> bytes:
        return ray.get(self.actor.get.remote(key, self.wait_timeout))

    def add(self, key, amount) -> int:
        return ray.get(self.actor.add.remote(key, int(amount)))

    def compare_set(self, key, expected, desired) -> bytes:
        return ray.get(self.actor.compare_set.remote(key, _bytes(expected), _bytes(desired)))

    def wait(self, keys, timeout=None) -> None:
        for key in keys:
            self.get(key)

    def check(self, keys) -> bool:
        return ray.get(self.actor.check.remote(list(keys)))

    def delete_key(self, key) -> bool:
        return ray.get(self.actor.delete_key.remote(key))

    def num_keys(self) -> int:
        return ray.get(self.actor.num_keys.remote())


@ray.remote
class RankActor:
    """One rank: started like a hostproc child (role, logging, platform, plugins), then the usual worker."""

    def __init__(self, config, rank: int, store_actor) -> None:
        from kernelcore import envs, hostproc, platforms
        from kernelcore.distributed import prepare_process_group
        from kernelcore.executor.uniproc import create_worker
        from kernelcore.logging_setup import configure_logging

        hostproc.set_role(f"worker-{rank}")
        try:
            import setproctitle

            setproctitle.setproctitle(f"kc::worker-{rank}")
        except ImportError:
            pass
        configure_logging()
        platforms.load_general_plugins()
        self.rank = rank
        self.store = RayStore(store_actor, envs.KC_READY_TIMEOUT)  # kept alive: torch holds only a C++ handle
        if config.parallel.world_size > 1:
            import os

            from kernelcore.hostproc.tcp import interface_of

            interface = interface_of(ray.util.get_node_ip_address())  # the address Ray knows this node by
            for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if interface and not os.environ.get(variable):
                    os.environ[variable] = interface
            prepare_process_group()  # before the group exists: see its docstring
            dist.init_process_group(backend=platforms.current_platform.dist_backend, store=self.store, rank=rank,
                                    world_size=config.parallel.world_size)
        self.worker = create_worker(config, rank=rank)
        from builtin_plugins.executors.multiproc import Reply, WorkerRequest

        self.encoder, self.decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(WorkerRequest)
        self.reply_type = Reply

    def ready(self) -> bool:
        return True

    def call(self, payload: bytes) -> bytes:
        from builtin_plugins.executors.multiproc import handle_call
        from kernelcore.distributed import shutdown_distributed

        reply = handle_call(self.worker, self.decoder.decode(payload), self.rank)
        if reply is None:
            shutdown_distributed()
            reply = self.reply_type()
        return self.encoder.encode(reply)
