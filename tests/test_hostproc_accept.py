"""AuthenticatedListener on loopback: only a peer that proves the secret reaches the role's code, each
connection is served on its own thread, refusals are logged, and close() ends the accept thread."""

import logging
import queue
import socket
import threading

import pytest

from kernelcore.hostproc.accept import AuthenticatedListener
from kernelcore.hostproc.tcp import ClusterAuthError, connect_authenticated, listen

SECRET = "accept-test-secret"


@pytest.fixture
def port():
    """A listener on 127.0.0.1 whose callback records (hello, host, thread name) and closes the connection."""
    peers: queue.Queue = queue.Queue()

    def on_peer(conn: socket.socket, hello: dict, host: str) -> None:
        peers.put((hello, host, threading.current_thread().name))
        conn.close()

    sock = listen("127.0.0.1", 0)
    listener = AuthenticatedListener(sock, SECRET, on_peer, name="test-accept", peer_name="test-peer",
                                     log=logging.getLogger("kernelcore.test-accept"))
    yield listener, sock.getsockname()[1], peers
    listener.close()


def test_an_authenticated_peer_reaches_the_callback_on_its_own_thread(port):
    listener, number, peers = port
    assert listener.thread.name == "test-accept" and listener.thread.daemon
    connect_authenticated("127.0.0.1", number, SECRET, {"kind": "node", "node_rank": 1}, timeout=10).close()
    hello, host, thread = peers.get(timeout=10)
    assert hello == {"kind": "node", "node_rank": 1} and host == "127.0.0.1" and thread == "test-peer"


def test_a_bad_secret_is_refused_and_logged(port, caplog):
    _, number, peers = port
    with caplog.at_level(logging.WARNING, logger="kernelcore.test-accept"):
        with pytest.raises(ClusterAuthError, match="refused this host: bad cluster secret"):
            connect_authenticated("127.0.0.1", number, "another-secret", {"kind": "node"}, timeout=10)
        connect_authenticated("127.0.0.1", number, SECRET, {"kind": "after"}, timeout=10).close()
        assert peers.get(timeout=10)[0] == {"kind": "after"}  # the refused one never reached the callback
    assert any("refused cluster connection from 127.0.0.1" in r.getMessage() for r in caplog.records)
    assert peers.empty()


def test_garbage_is_refused_and_logged(port, caplog):
    _, number, peers = port
    with caplog.at_level(logging.WARNING, logger="kernelcore.test-accept"):
        with socket.create_connection(("127.0.0.1", number), timeout=10) as raw:
            raw.recv(4096)  # the challenge
            raw.sendall(b"\x00\x00\x00\x05hello")
            assert raw.recv(4096) == b""  # closed without a verdict
    assert any("malformed handshake" in r.getMessage() for r in caplog.records)
    assert peers.empty()


def test_a_silent_peer_does_not_hold_up_the_others(port):
    _, number, peers = port
    with socket.create_connection(("127.0.0.1", number), timeout=10):  # connects, then never answers
        connect_authenticated("127.0.0.1", number, SECRET, {"kind": "second"}, timeout=10).close()
        assert peers.get(timeout=5)[0] == {"kind": "second"}


def test_close_closes_the_socket_and_ends_the_thread(port):
    listener, number, _ = port
    listener.close()
    listener.thread.join(5)
    assert not listener.thread.is_alive() and listener.sock.fileno() == -1
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", number), timeout=2)
