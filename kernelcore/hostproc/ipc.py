"""Local IPC between kernelcore processes: unix-domain sockets carrying msgspec/msgpack frames.

Never pickle: every message is a msgspec Struct decoded against a declared
type, so a client-influenced value can only ever become data. Sockets live in
a private (0700) temporary directory; nothing listens on a network interface.
"""

from __future__ import annotations

import asyncio
import collections
import os
import selectors
import shutil
import socket
import struct
import tempfile
import time
from typing import Any

import msgspec

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30


_PREFIX = "kc-ipc-"
_root: str | None = None  # where this process makes its private directories (inside its parent's)


def use_private_root(path: str) -> None:
    """Make later private directories inside ``path``, so whoever owns it removes them all, even after a crash."""
    global _root
    _root = path


def private_socket_dir() -> str:
    # nested only while socket paths stay well inside AF_UNIX's 108 bytes
    root = _root if _root is not None and len(_root) < 64 else None
    return tempfile.mkdtemp(prefix=_PREFIX, dir=root)  # mkdtemp creates it 0700


def remove_private_dir(path: str, only_if_empty: bool = False) -> None:
    """Remove a directory made by :func:`private_socket_dir` (nothing else: the name is checked)."""
    if not os.path.basename(path).startswith(_PREFIX):
        return
    try:
        if only_if_empty:
            os.rmdir(path)
        else:
            shutil.rmtree(path)
    except OSError:  # not empty yet, or already gone
        pass


class Channel:
    """A blocking, framed, typed message channel over a connected socket."""

    def __init__(self, sock: socket.socket, decode_type: Any) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(decode_type)
        self._buffer = bytearray()
        self._pending: collections.deque = collections.deque()
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)

    @classmethod
    def connect(cls, path: str, decode_type: Any, timeout: float = 30.0) -> Channel:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return cls(sock, decode_type)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def send(self, message: Any) -> None:
        self.sock.sendall(_frame(self._encoder.encode(message)))

    def _decode_buffered(self) -> None:
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME:
                raise ValueError(f"IPC frame of {size} bytes exceeds the limit")
            if len(self._buffer) < _HEADER.size + size:
                return
            frame = bytes(self._buffer[_HEADER.size:_HEADER.size + size])
            del self._buffer[:_HEADER.size + size]
            self._pending.append(self._decoder.decode(frame))

    def recv_available(self, timeout: float | None) -> list[Any]:
        """Every message available within ``timeout`` (None blocks until at least one); [] on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._selector.select(remaining):
                return []
            self._read_some()
        while self._selector.select(0):  # drain what else has already arrived
            self._read_some()
        messages = list(self._pending)
        self._pending.clear()
        return messages

    def recv(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._selector.select(remaining):
                raise TimeoutError("no message within the timeout")
            self._read_some()
        return self._pending.popleft()

    def _read_some(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("peer closed the channel")
        self._buffer.extend(chunk)
        self._decode_buffered()

    def is_closed(self) -> bool:
        """Whether the peer has closed (or reset) the connection, without consuming anything."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        self._selector.close()
        self.sock.close()


def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


def send_frame(sock: socket.socket, message: Any) -> None:
    """One message in the channel's framing, on a socket not (yet) wrapped in a channel."""
    sock.sendall(_frame(msgspec.msgpack.encode(message)))


class Listener:
    """A unix-domain listening socket in a private directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(16)

    def accept_socket(self, timeout: float) -> socket.socket:
        self.sock.settimeout(timeout)
        conn, _ = self.sock.accept()
        conn.settimeout(None)
        return conn

    def accept(self, decode_type: Any, timeout: float) -> Channel:
        return Channel(self.accept_socket(timeout), decode_type)

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        remove_private_dir(os.path.dirname(self.path), only_if_empty=True)


class AsyncChannel:
    """The asyncio side of a channel (the front end's event loop)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decode_type: Any) -> None:
        self.reader, self.writer = reader, writer
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(decode_type)

    @classmethod
    async def from_socket(cls, sock: socket.socket, decode_type: Any) -> AsyncChannel:
        if sock.family == socket.AF_UNIX:
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_FRAME)
        else:  # an authenticated TCP connection from another host (same frames)
            reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_FRAME)
        return cls(reader, writer, decode_type)

    def send_nowait(self, message: Any) -> None:
        self.writer.write(_frame(self._encoder.encode(message)))

    async def send(self, message: Any) -> None:
        self.send_nowait(message)
        await self.writer.drain()

    async def recv(self) -> Any:
        header = await self.reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            raise ValueError(f"IPC frame of {size} bytes exceeds the limit")
        return self._decoder.decode(await self.reader.readexactly(size))

    def close(self) -> None:
        self.writer.close()
