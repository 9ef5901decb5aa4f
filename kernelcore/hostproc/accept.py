"""The server side of the cluster ports: accept, authenticate, then hand the peer to the role's code.

:class:`AuthenticatedListener` owns the accept thread of a listening socket (:func:`~kernelcore.hostproc.tcp.listen`).
Every connection runs the handshake of :func:`~kernelcore.hostproc.tcp.accept_authenticated` (at most
``HANDSHAKE_TIMEOUT`` per step) on a thread of its own, so a slow or silent peer never holds up the others; a
peer that fails it is logged and closed, and only an authenticated one reaches ``on_peer``.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from kernelcore.hostproc.tcp import accept_authenticated

logger = logging.getLogger("kernelcore.cluster")

OnPeer = Callable[[socket.socket, dict[str, Any], str], None]  # (connection, the peer's hello, its host)


class AuthenticatedListener:
    """Serves ``sock`` from a daemon thread named ``name`` until :meth:`close`.

    ``on_peer(conn, hello, host)`` runs on the connection's own thread (named ``peer_name``) once the peer
    proved ``secret``; from then on the connection is the callback's to keep or close. Refusals are logged
    as warnings on ``log``, so each port reports them under its own logger.
    """

    def __init__(self, sock: socket.socket, secret: str, on_peer: OnPeer, *, name: str, peer_name: str,
                 log: logging.Logger = logger) -> None:
        self.sock, self.secret, self.on_peer = sock, secret, on_peer
        self.peer_name, self.log = peer_name, log
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self.thread.start()

    def _accept_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the socket was closed: the port is stopping
                return
            threading.Thread(target=self._handle, args=(conn,), name=self.peer_name, daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            host = conn.getpeername()[0]
            hello = accept_authenticated(conn, self.secret)
        except (OSError, ValueError, msgspec.MsgspecError) as exc:
            self.log.warning("%s", exc)
            conn.close()
            return
        self.on_peer(conn, hello, host)

    def close(self) -> None:
        """Stop accepting: the socket is shut down (which wakes the blocked ``accept``, ending the thread) and
        closed. Never waits, so an event loop may call it; connections handed to ``on_peer`` stay open."""
        self.stopped.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
