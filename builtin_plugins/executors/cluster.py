"""The head's side of a multi-node engine: one cluster port (bound to --master-addr only) that authenticates
every connection and then serves it as a node (heartbeats, configuration check), a remote worker's control
channel, or the rendezvous store. A node lost (closed, or silent for HEARTBEAT_TIMEOUT) is recorded in
``lost`` for the executor to report; closing the server tells every node to shut down."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import cast

import msgspec

from kernelcore import envs
from kernelcore.config_fingerprint import fingerprint, mismatches
from kernelcore.contract.config import KernelConfig
from kernelcore.hostproc import ProcessStartError
from kernelcore.hostproc.accept import AuthenticatedListener
from kernelcore.hostproc.ipc import Channel
from kernelcore.hostproc.tcp import connect_authenticated, interface_of, listen

logger = logging.getLogger("kernelcore.cluster")

HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 10.0  # default of KC_CLUSTER_HEARTBEAT_TIMEOUT: a node (or the head) silent this long is gone
CLUSTER_SCHEME = "kc-cluster://"


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    pass


class NodeShutdown(msgspec.Struct, tag="shutdown"):
    pass


class NodeAccept(msgspec.Struct, tag="accept"):
    pass


class NodeReject(msgspec.Struct, tag="reject"):
    error: str


NodeMessage = Heartbeat | NodeShutdown | NodeAccept | NodeReject


def exchange_heartbeats(channel: Channel, stop: threading.Event, send_lock: threading.Lock) -> str:
    """Send a heartbeat every interval and read the peer's until ``stop`` ("stopped") or the peer's
    NodeShutdown ("shutdown"); raises when the peer closes or stays silent for HEARTBEAT_TIMEOUT."""
    last_heard, next_send = time.monotonic(), 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_send:
            with send_lock:
                channel.send(Heartbeat())
            next_send = now + HEARTBEAT_INTERVAL
        for message in channel.recv_available(HEARTBEAT_INTERVAL):
            last_heard = time.monotonic()
            if isinstance(message, NodeShutdown):
                return "shutdown"
        timeout = envs.KC_CLUSTER_HEARTBEAT_TIMEOUT
        if time.monotonic() - last_heard > timeout:
            raise TimeoutError(f"no heartbeat for {timeout:g}s")
    return "stopped"


class ClusterServer:
    def __init__(self, config: KernelConfig) -> None:
        from builtin_plugins.executors.store import StoreTable

        p = config.parallel
        # build_config requires the head's address, port and a secret when nnodes > 1
        self.parallel, self.secret = p, cast(str, p.cluster_secret)
        self.address = f"{p.master_addr}:{p.master_port}"
        self.expected = fingerprint(config)
        self.table = StoreTable()
        self.changed = threading.Condition()
        self.nodes: dict[int, str] = {}  # node rank -> its address
        self.workers: dict[int, tuple[socket.socket, str]] = {}  # remote rank -> (control socket, address)
        self.failure: str | None = None  # a node refused at start-up (fails the engine's start)
        self.lost: str | None = None  # a node gone after it joined
        self.stop = threading.Event()
        self.node_threads: list[threading.Thread] = []
        self.node_channels: list[tuple[Channel, threading.Lock]] = []
        sock = listen(cast(str, p.master_addr), cast(int, p.master_port))
        logger.info("Cluster port listening on %s for %d more node(s)", self.address, p.nnodes - 1)
        self.listener = AuthenticatedListener(sock, self.secret, self._handle, name="kc-cluster-accept",
                                              peer_name="kc-cluster-conn", log=logger)

    def _handle(self, conn: socket.socket, hello: dict, host: str) -> None:
        """An authenticated connection (on its own thread): serve it as what its hello says it is."""
        from builtin_plugins.executors.store import StoreRequest

        kind = hello.get("kind")
        if kind == "store":
            self.table.serve(Channel(conn, StoreRequest))
        elif kind == "worker":
            with self.changed:
                self.workers[int(hello.get("rank", -1))] = (conn, host)
                self.changed.notify_all()
        elif kind == "node":
            thread = threading.current_thread()
            self.node_threads.append(thread)
            self._serve_node(Channel(conn, NodeMessage), hello, host)
        else:
            logger.warning("cluster connection from %s of unknown kind %r closed", host, kind)
            conn.close()

    def _serve_node(self, channel: Channel, hello: dict, host: str) -> None:
        node_rank = hello.get("node_rank")
        where = f"node {node_rank} ({host})"
        problems = mismatches(self.expected, dict(hello.get("fingerprint") or {}), where)
        if not isinstance(node_rank, int) or not 0 < node_rank < self.parallel.nnodes:
            problems.append(f"node rank {node_rank!r} is outside 1..{self.parallel.nnodes - 1}")
        elif node_rank in self.nodes:
            problems.append(f"node rank {node_rank} already joined from {self.nodes[node_rank]}")
        if problems:
            error = f"{where} cannot join the head at {self.address}: " + "; ".join(problems)
            logger.error("%s", error)
            try:
                channel.send(NodeReject(error))
            except OSError:
                pass
            channel.close()
            with self.changed:
                self.failure = self.failure or error
                self.changed.notify_all()
            return
        channel.send(NodeAccept())
        send_lock = threading.Lock()
        with self.changed:
            self.nodes[cast(int, node_rank)] = host  # checked above
            self.node_channels.append((channel, send_lock))
            self.changed.notify_all()
        logger.info("%s joined", where)
        try:
            exchange_heartbeats(channel, self.stop, send_lock)
        except (OSError, TimeoutError) as exc:
            if not self.stop.is_set():
                self.lost = f"{where} lost: {exc}"
                logger.error("%s", self.lost)

    def wait_for_nodes(self, timeout: float) -> None:
        expected = set(range(1, self.parallel.nnodes))
        with self.changed:
            self.changed.wait_for(lambda: self.failure or set(self.nodes) == expected, timeout)
            if self.failure:
                raise ProcessStartError(self.failure)
            missing = sorted(expected - set(self.nodes))
        if missing:
            raise ProcessStartError(f"node(s) {missing} did not join the head at {self.address} within {timeout:.0f}s "
                                    "(started with --headless, the same --cluster-secret, reaching --master-addr?)")

    def worker_channel(self, rank: int, decode_type, timeout: float) -> tuple[Channel, str]:
        with self.changed:
            self.changed.wait_for(lambda: rank in self.workers or self.lost, timeout)
            if rank not in self.workers:
                raise ProcessStartError(self.lost or f"worker-{rank} did not connect to {self.address} within "
                                        f"{timeout:.0f}s")
            sock, host = self.workers[rank]
        return Channel(sock, decode_type), host

    def close(self) -> None:
        """Tell every node the engine is shutting down, then close the cluster port."""
        self.stop.set()
        for channel, send_lock in self.node_channels:
            try:
                with send_lock:
                    channel.send(NodeShutdown())
            except OSError:
                pass
        for thread in self.node_threads:
            thread.join(2 * HEARTBEAT_INTERVAL)
        for channel, _ in self.node_channels:
            channel.close()
        self.listener.close()


_stores: list = []  # torch keeps a C++ handle only: the Python store object must stay alive


def join_cluster(config: KernelConfig, rank: int) -> None:
    """Join the engine's process group through the head's store (any host, this node's interface)."""
    import torch.distributed as dist

    from builtin_plugins.executors.store import ClusterStore, StoreReply
    from kernelcore import envs
    from kernelcore.distributed import prepare_process_group
    from kernelcore.platforms import current_platform

    p = config.parallel
    sock = connect_authenticated(cast(str, p.master_addr), cast(int, p.master_port), cast(str, p.cluster_secret),
                                 {"kind": "store", "rank": rank, "node_rank": p.node_rank},
                                 timeout=envs.KC_READY_TIMEOUT)
    interface = interface_of(sock.getsockname()[0])  # the one this host reaches the head through
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if interface and not os.environ.get(variable):
            os.environ[variable] = interface
    store = ClusterStore(Channel(sock, StoreReply), timeout=envs.KC_READY_TIMEOUT)
    _stores.append(store)
    prepare_process_group()  # before the group exists: see its docstring
    dist.init_process_group(backend=current_platform.dist_backend, store=store, rank=rank, world_size=p.world_size)
