"""Data parallelism in the front end: which engine-core replica serves a request.

Load first: a request goes to the replica with the fewest requests in flight. Prefix affinity on top: the
front end remembers which replica last served each block-aligned prompt prefix (hashed, LRU-bounded), and
a request whose longest remembered prefix points at a replica that is at most ``slack`` requests busier
than the least-loaded one goes there, where that prefix is likely still cached.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import os
from collections.abc import Awaitable
from typing import Any

from kernelcore.contract.config import KernelConfig
from kernelcore.metrics.stats import EngineStats


@dataclasses.dataclass
class Replica:
    process: Any  # None for a replica on another host (its own host supervises it)
    channel: Any
    info: dict
    private_dir: str | None
    host: str = "local"


async def _start_one(config: KernelConfig) -> Replica:
    from kernelcore.engine.core_client import start_engine_core
    from kernelcore.engine.core_proc import FromCore
    from kernelcore.hostproc.ipc import AsyncChannel

    process, listener, info = await asyncio.to_thread(start_engine_core, config)
    try:
        sock = await asyncio.to_thread(listener.accept_socket, 30.0)
    finally:
        listener.close()
    return Replica(process, await AsyncChannel.from_socket(sock, FromCore), info, os.path.dirname(listener.path))


async def _join_remote(config: KernelConfig) -> list[Replica]:
    from kernelcore import envs
    from kernelcore.engine.core_proc import FromCore
    from kernelcore.engine.dp_remote import ReplicaPort
    from kernelcore.hostproc.ipc import AsyncChannel

    port = ReplicaPort(config)
    try:
        joined = await port.wait(envs.KC_READY_TIMEOUT)
    finally:
        port.close()
    return [Replica(None, await AsyncChannel.from_socket(sock, FromCore), info, None, host)
            for _, (sock, info, host) in sorted(joined.items())]


async def start_replicas(config: KernelConfig) -> list[Replica]:
    """One engine core per data-parallel replica, in rank order: this host's started here, the other hosts'
    joined over the authenticated port; all of them, or none (the others stopped)."""
    p = config.parallel
    local = list(p.data_parallel_local_ranks)
    configs = [config] if p.data_parallel_size == 1 else [
        dataclasses.replace(config, parallel=dataclasses.replace(p, data_parallel_rank=r)) for r in local]
    starts: list[Awaitable[Replica | list[Replica]]] = [_start_one(c) for c in configs]
    if len(local) < p.data_parallel_size:
        starts.append(_join_remote(config))
    results = await asyncio.gather(*starts, return_exceptions=True)
    replicas = [r for result in results if not isinstance(result, BaseException)
                for r in (result if isinstance(result, list) else [result])]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for r in replicas:
            r.channel.close()
            if r.process is not None:
                r.process.terminate()
        raise errors[0]
    return replicas


class DPRouter:
    def __init__(self, num_replicas: int, block_size: int, stat_loggers: list | None = None, model_name: str = "model",
                 slack: int = 2, max_prefixes: int = 1 << 16) -> None:
        self.num_replicas, self.block_size, self.slack = num_replicas, block_size, slack
        self.load = [0] * num_replicas
        self.alive = [True] * num_replicas  # a replica lost on another host is dropped, the others serve on
        self.prefixes: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.max_prefixes = max_prefixes
        self.latest = [EngineStats() for _ in range(num_replicas)]
        prometheus = next((s for s in stat_loggers or () if hasattr(s, "registry")), None)
        self.metrics = None if prometheus is None else self._metrics(prometheus.registry, model_name,
                                                                     getattr(prometheus, "prefix", "kc"))

    def _metrics(self, registry, model_name: str, prefix: str) -> dict[str, Any]:
        """Per-replica series beside the Prometheus logger's totals (same registry and prefix, ``replica`` label)."""
        import prometheus_client as prom

        labels = ["model_name", "replica"]

        def per_replica(metric):
            return [metric.labels(model_name=model_name, replica=str(r)) for r in range(self.num_replicas)]

        def series(kind, name: str, doc: str):
            return per_replica(kind(f"{prefix}:{name}", doc, labels, registry=registry))

        routed = prom.Counter(f"{prefix}:dp_routed_requests", "Requests routed to each data-parallel replica, by why.",
                              [*labels, "reason"], registry=registry)
        metrics = {
            "routed": {(r, why): routed.labels(model_name=model_name, replica=str(r), reason=why)
                       for r in range(self.num_replicas) for why in ("prefix", "load")},
            "running": series(prom.Gauge, "dp_num_requests_running", "Requests running, per replica."),
            "waiting": series(prom.Gauge, "dp_num_requests_waiting", "Requests waiting, per replica."),
            "kv": series(prom.Gauge, "dp_kv_cache_usage_perc", "KV-cache use (0..1), per replica."),
            "hits": series(prom.Counter, "dp_prefix_cache_hits", "Prompt tokens found in the cache, per replica."),
            "up": series(prom.Gauge, "dp_replica_up", "1 while the replica serves, 0 once it was lost."),
            "resubmitted": series(prom.Counter, "dp_requests_resubmitted",
                                  "Requests in flight on the replica when it was lost, carried to another one."),
            "queries": series(prom.Counter, "dp_prefix_cache_queries", "Prompt tokens looked up, per replica."),
        }
        for gauge in metrics["up"]:
            gauge.set(1)
        return metrics

    def record(self, replica: int, stats: EngineStats) -> EngineStats:
        """Label one replica's step and return it with the engine-wide gauges (sums, mean KV use)."""
        self.latest[replica] = stats
        if self.metrics is not None:
            m = self.metrics
            m["running"][replica].set(stats.num_running)
            m["waiting"][replica].set(stats.num_waiting)
            m["kv"][replica].set(stats.kv_cache_usage)
            m["hits"][replica].inc(stats.num_prefix_cache_hits)
            m["queries"][replica].inc(stats.num_prefix_cache_queries)
        return dataclasses.replace(stats, num_running=sum(s.num_running for s in self.latest),
                                   num_waiting=sum(s.num_waiting for s in self.latest),
                                   kv_cache_usage=sum(s.kv_cache_usage for s in self.latest) / max(1, sum(self.alive)))

    def _prefix_keys(self, token_ids: list[int]) -> list[bytes]:
        """Hashes of every block-aligned prefix, shortest first."""
        keys, h = [], hashlib.blake2b(digest_size=16)
        for end in range(self.block_size, len(token_ids) + 1, self.block_size):
            h.update(repr(token_ids[end - self.block_size:end]).encode())
            keys.append(h.copy().digest())
        return keys

    def drop(self, replica: int) -> None:
        """Route nothing more to ``replica`` (lost); its share of the gauges goes to zero."""
        self.alive[replica] = False
        self.latest[replica] = EngineStats()
        if self.metrics is not None:
            for name in ("up", "running", "waiting", "kv"):
                self.metrics[name][replica].set(0)

    def resubmitted(self, lost: int, token_ids: list[int]) -> int:
        """Where a request that was running on the lost replica goes on (and count it)."""
        self.finished(lost)
        if self.metrics is not None:
            self.metrics["resubmitted"][lost].inc()
        return self.choose(token_ids)

    def choose(self, token_ids: list[int]) -> int:
        keys = self._prefix_keys(token_ids)
        serving = [r for r in range(self.num_replicas) if self.alive[r]]
        least = min(serving, key=lambda r: (self.load[r], r))
        replica, reason = least, "load"
        for key in reversed(keys):
            owner = self.prefixes.get(key)
            if owner is not None and self.alive[owner]:
                if self.load[owner] <= self.load[least] + self.slack:
                    replica, reason = owner, "prefix"
                break
        for key in keys:
            self.prefixes[key] = replica
            self.prefixes.move_to_end(key)
        while len(self.prefixes) > self.max_prefixes:
            self.prefixes.popitem(last=False)
        self.load[replica] += 1
        if self.metrics is not None:
            self.metrics["routed"][(replica, reason)].inc()
        return replica

    def finished(self, replica: int) -> None:
        self.load[replica] = max(0, self.load[replica] - 1)
