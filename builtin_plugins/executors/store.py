"""The rendezvous store of a multi-node engine, served by the head over its authenticated cluster port.

torch's TCPStore listens on every interface; this one is a key-value table in the engine-core process that
ranks reach through :mod:`kernelcore.hostproc.tcp` (the secret proven, msgspec frames), wrapped in a
``torch.distributed.Store`` that gloo/NCCL use to exchange their addresses.
"""

from __future__ import annotations

import datetime
import threading

import msgspec
import torch.distributed as dist

from kernelcore.hostproc.ipc import Channel


class StoreRequest(msgspec.Struct):
    op: str  # set | get | add | compare_set | wait | check | delete_key | num_keys
    key: str = ""
    value: bytes = b""
    expected: bytes = b""
    keys: list[str] = []
    amount: int = 0
    timeout: float = 300.0


class StoreReply(msgspec.Struct):
    value: bytes = b""
    number: int = 0
    error: str = ""


class StoreTable:
    """The head's table; every connection is served by its own thread (get and wait block)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def _wait_for(self, keys: list[str], timeout: float) -> None:
        if not self.changed.wait_for(lambda: all(k in self.data for k in keys), timeout):
            raise TimeoutError(f"store keys {keys} not set within {timeout:.0f}s")

    def handle(self, r: StoreRequest) -> StoreReply:
        with self.changed:
            if r.op == "set":
                self.data[r.key] = r.value
            elif r.op == "get":
                self._wait_for([r.key], r.timeout)
                return StoreReply(value=self.data[r.key])
            elif r.op == "add":
                number = int(self.data.get(r.key, b"0")) + r.amount
                self.data[r.key] = str(number).encode()
                self.changed.notify_all()
                return StoreReply(number=number)
            elif r.op == "compare_set":
                current = self.data.get(r.key)
                if (current is None and not r.expected) or current == r.expected:
                    self.data[r.key] = current = r.value
                    self.changed.notify_all()
                return StoreReply(value=r.expected if current is None else current)
            elif r.op == "wait":
                self._wait_for(r.keys, r.timeout)
            elif r.op == "check":
                return StoreReply(number=int(all(k in self.data for k in r.keys)))
            elif r.op == "delete_key":
                return StoreReply(number=int(self.data.pop(r.key, None) is not None))
            elif r.op == "num_keys":
                return StoreReply(number=len(self.data))
            else:
                return StoreReply(error=f"unknown store op {r.op!r}")
            self.changed.notify_all()
            return StoreReply()

    def serve(self, channel: Channel) -> None:
        try:
            while True:
                request = channel.recv()
                try:
                    reply = self.handle(request)
                except TimeoutError as exc:
                    reply = StoreReply(error=str(exc))
                channel.send(reply)
        except (ConnectionError, OSError):
            pass
        finally:
            channel.close()


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else bytes(value) if isinstance(value, (bytearray, list)) \
        else str(value).encode()


class ClusterStore(dist.Store):
    """A torch.distributed Store whose table lives in the head (keep a reference while it is in use)."""

    def __init__(self, channel: Channel, timeout: float = 300.0) -> None:
        super().__init__()
        self.channel, self.wait_timeout = channel, timeout
        self.lock = threading.Lock()

    def _call(self, **fields) -> StoreReply:
        with self.lock:
            self.channel.send(StoreRequest(timeout=self.wait_timeout, **fields))
            reply = self.channel.recv()
        if reply.error:
            raise RuntimeError(f"cluster store: {reply.error}")
        return reply

    def set(self, key, value) -> None:
        self._call(op="set", key=key, value=_bytes(value))

    def get(self, key) -> bytes:
        return self._call(op="get", key=key).value

    def add(self, key, amount) -> int:
        return self._call(op="add", key=key, amount=int(amount)).number

    def compare_set(self, key, expected, desired) -> bytes:
        return self._call(op="compare_set", key=key, expected=_bytes(expected), value=_bytes(desired)).value

    def wait(self, keys, timeout: datetime.timedelta | None = None) -> None:
        self._call(op="wait", keys=list(keys))

    def check(self, keys) -> bool:
        return bool(self._call(op="check", keys=list(keys)).number)

    def delete_key(self, key) -> bool:
        return bool(self._call(op="delete_key", key=key).number)

    def num_keys(self) -> int:
        return self._call(op="num_keys").number
