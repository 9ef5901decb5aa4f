"""Data-parallel replicas on other hosts.

The head (data-parallel ranks 0..L-1 local) opens one port, bound to ``--data-parallel-address`` only, where the
other hosts' engine cores (``kc serve --headless --data-parallel-start-rank S``) connect once their model is
loaded. Every connection proves the cluster secret (HMAC challenge-response, :mod:`kernelcore.hostproc.tcp`) and
brings its rank, configuration fingerprint and ready report; the head answers with a :class:`JoinVerdict`.
From then on the connection carries the engine core's ordinary msgpack messages (never pickle), exactly as the
local replicas' unix sockets do. TCP keepalive on both ends notices a host that vanished in about 10 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import cast

import msgspec

from kernelcore import envs, hostproc
from kernelcore.config_fingerprint import fingerprint, mismatches
from kernelcore.contract.config import KernelConfig
from kernelcore.engine.core_proc import AbortRequests, AddLora, AddRequests, RemoveLora, ShutdownCore
from kernelcore.hostproc.accept import AuthenticatedListener
from kernelcore.hostproc.ipc import Channel, private_socket_dir, remove_private_dir, send_frame, use_private_root
from kernelcore.hostproc.tcp import HANDSHAKE_TIMEOUT, connect_authenticated, listen, set_keepalive

logger = logging.getLogger("kernelcore.engine")


class JoinVerdict(msgspec.Struct, tag="join"):
    error: str = ""  # empty: accepted


RemoteToCore = JoinVerdict | AddRequests | AbortRequests | ShutdownCore | AddLora | RemoveLora


class ReplicaPort:
    """The head's side: accepts the remote replicas (ranks ``remote``) until each has joined once."""

    def __init__(self, config: KernelConfig) -> None:
        p = config.parallel
        self.address = f"{p.data_parallel_address}:{p.data_parallel_rpc_port}"
        self.secret = cast(str, p.cluster_secret)
        self.expected = fingerprint(config)
        self.remote = set(range(p.data_parallel_size)) - set(p.data_parallel_local_ranks)
        self.joined: dict[int, tuple[socket.socket, dict, str]] = {}  # rank -> (socket, ready info, host)
        self.failure: str | None = None
        self.changed = threading.Condition()
        sock = listen(cast(str, p.data_parallel_address), cast(int, p.data_parallel_rpc_port))
        logger.info("Data-parallel port listening on %s for replicas %s", self.address, sorted(self.remote))
        self.listener = AuthenticatedListener(sock, self.secret, self._handle, name="kc-dp-accept",
                                              peer_name="kc-dp-join", log=logger)

    def _handle(self, conn: socket.socket, hello: dict, host: str) -> None:
        """An authenticated connection (on its own thread): a replica joining, accepted or refused."""
        raw_rank = hello.get("dp_rank")
        rank = raw_rank if isinstance(raw_rank, int) else -1  # -1: refused below, not a remote rank
        where = f"data-parallel replica {raw_rank!r} ({host})"
        with self.changed:
            problems = [] if hello.get("kind") == "dp-replica" else [f"a {hello.get('kind')!r} connection"]
            problems += mismatches(self.expected, dict(hello.get("fingerprint") or {}), where)
            if rank not in self.remote:
                problems.append(f"rank {raw_rank!r} is not one of the remote replicas {sorted(self.remote)}")
            elif rank in self.joined:
                problems.append(f"rank {rank} already joined from {self.joined[rank][2]}")
            error = f"{where} cannot join the head at {self.address}: " + "; ".join(problems) if problems else ""
            try:
                send_frame(conn, JoinVerdict(error))
            except OSError as exc:
                error = error or f"{where} went away while joining: {exc}"
            if error:
                logger.error("%s", error)
                conn.close()
                self.failure = self.failure or error
            else:
                set_keepalive(conn)
                self.joined[rank] = (conn, dict(hello.get("info") or {}), host)
                logger.info("%s joined", where)
            self.changed.notify_all()

    async def wait(self, timeout: float) -> dict[int, tuple[socket.socket, dict, str]]:
        """Every remote replica's connection, once all joined; ProcessStartError when one was refused or late."""
        def wait() -> None:
            with self.changed:
                self.changed.wait_for(lambda: self.failure or set(self.joined) == self.remote, timeout)

        await asyncio.to_thread(wait)
        self.close()  # a replica joins once: later connections are refused by the closed port
        missing = sorted(self.remote - set(self.joined))
        if self.failure or missing:
            for conn, _, _ in self.joined.values():
                conn.close()
            raise hostproc.ProcessStartError(self.failure or (
                f"data-parallel replica(s) {missing} did not join {self.address} within {timeout:.0f}s (started "
                "with --headless --data-parallel-start-rank, the same --cluster-secret, reaching the address?)"))
        return dict(self.joined)

    def close(self) -> None:
        self.listener.close()


def run_remote_engine_core(config: KernelConfig, private_dir: str) -> None:
    """The target of an ``engine-core`` process on a headless data-parallel host."""
    from kernelcore.engine.core_proc import EngineCoreLoop, serve

    p = config.parallel
    use_private_root(private_dir)
    loop = EngineCoreLoop(config, cast(Channel, None))  # the model loads before the head is contacted
    info = loop.info()
    hello = {"kind": "dp-replica", "dp_rank": p.data_parallel_rank, "fingerprint": fingerprint(config), "info": info}
    sock = connect_authenticated(cast(str, p.data_parallel_address), cast(int, p.data_parallel_rpc_port),
                                 cast(str, p.cluster_secret), hello, timeout=envs.KC_READY_TIMEOUT)
    set_keepalive(sock)
    loop.channel = Channel(sock, RemoteToCore)
    verdict = loop.channel.recv(timeout=HANDSHAKE_TIMEOUT)
    if not isinstance(verdict, JoinVerdict) or verdict.error:
        loop.core.shutdown()
        raise ConnectionRefusedError(getattr(verdict, "error", "") or "the head did not answer the join")
    envs.freeze()
    hostproc.report_ready(info)
    serve(loop)
    if loop.is_running:  # the connection ended without the head's ShutdownCore: the head is gone
        logger.error("data-parallel replica %d: the head at %s:%s is gone", p.data_parallel_rank,
                     p.data_parallel_address, p.data_parallel_rpc_port)
        os._exit(1)


def run_dp_headless(config: KernelConfig) -> int:
    """``kc serve --headless`` with data parallelism: this host's replicas serve the head's front end.

    Exits 0 when the head shut them down, 1 when one failed to start, died, or lost the head.
    """
    import dataclasses

    p = config.parallel
    ranks = list(p.data_parallel_local_ranks)
    hostproc.set_role(f"dp-host-{ranks[0]}")
    head = f"{p.data_parallel_address}:{p.data_parallel_rpc_port}"
    private_dir = private_socket_dir()
    cores = [hostproc.spawn("kernelcore.engine.dp_remote.run_remote_engine_core", role=f"engine-core-dp{rank}",
                            args=(dataclasses.replace(config, parallel=dataclasses.replace(p, data_parallel_rank=rank)),
                                  private_dir)) for rank in ranks]
    try:
        for core in cores:
            core.wait_ready(envs.KC_READY_TIMEOUT)
        logger.info("data-parallel replicas %s serve the head at %s", ranks, head)
        while all(core.is_alive() for core in cores):
            time.sleep(0.5)
        failed = [c for c in cores if not c.is_alive() and c.process.exitcode != 0]
        if failed:
            logger.error("%s exited (exit code %s); stopping this host's replicas", failed[0].role,
                         failed[0].process.exitcode)
            return 1
        for core in cores:  # the head shuts every replica down together
            core.process.join(10)
        logger.info("the head at %s shut the replicas down; bye", head)
        return 0
    except hostproc.ProcessStartError as exc:
        logger.error("data-parallel replicas %s cannot serve the head at %s: %s", ranks, head, exc)
        return 1
    finally:
        for core in cores:
            core.terminate(timeout=3.0)
        remove_private_dir(private_dir)
