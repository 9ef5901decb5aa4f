"""``kc serve --headless``: a node without API or engine that runs its share of the ranks for the head.

It joins the head's cluster port (the secret proven, its configuration checked against the head's), spawns
one ``worker-i`` per local rank, and exchanges heartbeats with the head. It exits 0 when the head shuts the
engine down, and 1 (its workers terminated) when the head goes away, refuses it, or a local worker dies.
"""

from __future__ import annotations

import logging
import threading
from typing import cast

from builtin_plugins.executors.cluster import NodeMessage, NodeReject, exchange_heartbeats, fingerprint
from kernelcore import envs, hostproc
from kernelcore.contract.config import KernelConfig
from kernelcore.hostproc.ipc import Channel
from kernelcore.hostproc.tcp import HANDSHAKE_TIMEOUT, connect_authenticated

logger = logging.getLogger("kernelcore.cluster")


class _HeadWatch(threading.Thread):
    def __init__(self, channel: Channel) -> None:
        super().__init__(name="kc-head-watch", daemon=True)
        self.channel, self.stop, self.done = channel, threading.Event(), threading.Event()
        self.outcome = ""

    def run(self) -> None:
        try:
            self.outcome = exchange_heartbeats(self.channel, self.stop, threading.Lock())
        except (OSError, TimeoutError) as exc:
            self.outcome = f"lost: {exc}"
        self.done.set()


def run_headless(config: KernelConfig) -> int:
    p = config.parallel
    hostproc.set_role(f"node-{p.node_rank}")
    me, head = f"node {p.node_rank}", f"{p.master_addr}:{p.master_port}"
    try:
        sock = connect_authenticated(cast(str, p.master_addr), cast(int, p.master_port), cast(str, p.cluster_secret),
                                     {"kind": "node", "node_rank": p.node_rank, "fingerprint": fingerprint(config)},
                                     timeout=envs.KC_READY_TIMEOUT)
        channel = Channel(sock, NodeMessage)
        answer = channel.recv(timeout=HANDSHAKE_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        logger.error("%s (ranks %s) cannot join: %s", me, list(p.node_ranks(p.node_rank)), exc)
        return 1
    if isinstance(answer, NodeReject):
        logger.error("%s refused by the head: %s", me, answer.error)
        return 1
    logger.info("%s joined the head at %s; starting ranks %s", me, head, list(p.node_ranks(p.node_rank)))
    watch = _HeadWatch(channel)
    watch.start()
    workers = []
    try:
        for rank in p.node_ranks(p.node_rank):
            workers.append(hostproc.spawn("builtin_plugins.executors.multiproc.remote_worker_main",
                                          role=f"worker-{rank}", args=(config.for_rank(rank), rank)))
        for worker in workers:
            worker.wait_ready(envs.KC_READY_TIMEOUT)
        while not watch.done.wait(0.5):
            dead = [w for w in workers if not w.is_alive() and w.process.exitcode != 0]  # 0: told to shut down
            if dead:
                logger.error("%s: %s exited (exit code %s); leaving the cluster", me, dead[0].role,
                             dead[0].process.exitcode)
                return 1
        if watch.outcome == "shutdown":
            logger.info("%s: the head shut the engine down; bye", me)
            return 0
        logger.error("%s: the head at %s is gone (%s); stopping this node's workers", me, head, watch.outcome)
        return 1
    except hostproc.ProcessStartError as exc:
        logger.error("%s: %s", me, exc)
        return 1
    finally:
        watch.stop.set()
        for worker in workers:
            worker.terminate(timeout=3.0)
        channel.close()
