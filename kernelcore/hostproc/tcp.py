"""Authenticated TCP between hosts: HMAC-SHA256 challenge-response on a shared secret, then msgspec frames.

Never pickle, never listen on every interface: :func:`listen` binds exactly the address the user gave. Both
sides prove the secret (the server first challenges the client, then answers the client's challenge), so
neither a stranger nor a host with another secret gets past the handshake; a refusal is logged by the server
and raised by the client, with the peer's address. Until the handshake succeeds a frame is at most 4 KiB.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from typing import Any

import msgspec

logger = logging.getLogger("kernelcore.cluster")

_HEADER = struct.Struct("!I")
MAX_HANDSHAKE_FRAME = 4096
HANDSHAKE_TIMEOUT = 10.0


class ClusterAuthError(ConnectionError):
    """The peer did not prove the cluster secret (or refused ours)."""


class Challenge(msgspec.Struct, tag="challenge"):
    nonce: bytes


class Proof(msgspec.Struct, tag="proof"):
    nonce: bytes  # the client's challenge to the server
    mac: bytes  # HMAC(secret, "client" + server nonce + client nonce)
    hello: dict[str, Any]  # who is connecting: {"kind": "node" | "worker" | "store", "node_rank": ..., ...}


class Verdict(msgspec.Struct, tag="verdict"):
    ok: bool
    mac: bytes = b""  # HMAC(secret, "server" + client nonce + server nonce)
    error: str = ""


_Handshake = Challenge | Proof | Verdict
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Handshake)


def _mac(secret: str, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret.encode(), role + first + second, hashlib.sha256).digest()


def _send(sock: socket.socket, message: Any) -> None:
    payload = _encoder.encode(message)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed the connection during the handshake")
        data.extend(chunk)
    return bytes(data)


def _recv(sock: socket.socket, expected: type) -> Any:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_HANDSHAKE_FRAME:
        raise ClusterAuthError(f"handshake frame of {size} bytes (at most {MAX_HANDSHAKE_FRAME})")
    try:
        message = _decoder.decode(_recv_exact(sock, size))
    except msgspec.DecodeError as exc:
        raise ClusterAuthError(f"malformed handshake: {exc}") from None
    if not isinstance(message, expected):
        raise ClusterAuthError(f"expected {expected.__name__} in the handshake, got {type(message).__name__}")
    return message


def listen(address: str, port: int) -> socket.socket:
    """A listening socket bound to ``address`` only (never the wildcard)."""
    if address in ("", "0.0.0.0", "::"):
        raise ValueError("the cluster port binds one given address, not every interface")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot bind the cluster port {address}:{port}: {exc.strerror}") from None
    sock.listen(64)
    return sock


def accept_authenticated(sock: socket.socket, secret: str) -> dict[str, Any]:
    """Run the server side of the handshake on an accepted socket; returns the client's hello.

    Raises ClusterAuthError (after telling the client why) when the client does not prove the secret.
    """
    peer = "{}:{}".format(*sock.getpeername()[:2])
    sock.settimeout(HANDSHAKE_TIMEOUT)
    nonce = os.urandom(32)
    _send(sock, Challenge(nonce))
    proof = _recv(sock, Proof)
    if not hmac.compare_digest(proof.mac, _mac(secret, b"client", nonce, proof.nonce)):
        try:
            _send(sock, Verdict(False, error="bad cluster secret"))
        except OSError:
            pass
        raise ClusterAuthError(f"refused cluster connection from {peer}: bad cluster secret")
    _send(sock, Verdict(True, mac=_mac(secret, b"server", proof.nonce, nonce)))
    sock.settimeout(None)
    return dict(proof.hello)


def connect_authenticated(address: str, port: int, secret: str, hello: dict[str, Any],
                          timeout: float = 60.0) -> socket.socket:
    """Connect to the head (retrying until ``timeout`` while it is not up yet) and prove the secret."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=HANDSHAKE_TIMEOUT)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot reach the master at {address}:{port}: {exc}") from None
            time.sleep(0.2)
    try:
        challenge = _recv(sock, Challenge)
        nonce = os.urandom(32)
        _send(sock, Proof(nonce, _mac(secret, b"client", challenge.nonce, nonce), hello))
        verdict = _recv(sock, Verdict)
        if not verdict.ok:
            raise ClusterAuthError(f"the master at {address}:{port} refused this host: {verdict.error}")
        if not hmac.compare_digest(verdict.mac, _mac(secret, b"server", nonce, challenge.nonce)):
            raise ClusterAuthError(f"the master at {address}:{port} did not prove the cluster secret")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def set_keepalive(sock: socket.socket, idle: float = 2.0, interval: float = 1.0, count: int = 5,
                  user_timeout: float = 10.0) -> None:
    """Let the kernel notice a peer host that vanished (link down, powered off) while the connection is idle
    (keepalive probes) or busy (unacknowledged data for ``user_timeout``): reads then fail, in about 10 s.
    The probes are answered by the peer's kernel, so a long engine step is never mistaken for a lost host."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), max(1, int(value)))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(user_timeout * 1000))


def interface_of(ip: str) -> str | None:
    """The network interface holding ``ip`` (for GLOO_SOCKET_IFNAME), or None."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addresses):
            return name
    return None
