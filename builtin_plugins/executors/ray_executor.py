"""The ``ray`` executor: one Ray actor per rank on an existing Ray cluster (``pip install kernelcore[ray]``).

The engine core connects to the cluster (``RAY_ADDRESS``, else ``address="auto"``), reserves one bundle per
rank in a placement group (refused at once, with the cluster's free resources, when it cannot fit), and
starts ``kc::worker-<rank>`` actors that load plugins and build the same worker class as the ``mp``
executor. Calls travel as msgspec/msgpack bytes (Ray only carries the bytes); the ranks meet through a
rendezvous store kept in a Ray actor.
"""

from __future__ import annotations

import logging

import msgspec

from builtin_plugins.executors.multiproc import Call, Execute, LoraCall, Reply, WorkerRequest
from kernelcore import envs
from kernelcore.contract.config import KernelConfig
from kernelcore.executor.base import ExecutorBase, WorkerDiedError

logger = logging.getLogger("kernelcore.executor")


def _ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("the ray executor needs Ray: pip install 'kernelcore[ray]'") from None
    return ray


class RayExecutor(ExecutorBase):
    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from builtin_plugins.executors.ray_actors import RankActor, StoreActor

        self.world_size = config.parallel.world_size
        if not ray.is_initialized():
            import os

            ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=True)
        bundle = {"CPU": 1.0}
        free = ray.available_resources()
        if free.get("CPU", 0) < self.world_size:
            raise RuntimeError(f"the Ray cluster lacks the resources for {self.world_size} workers of {bundle}: "
                               f"it has {dict(sorted(free.items()))} free")
        self._remove_pg = remove_placement_group
        self.pg = placement_group([bundle] * self.world_size, strategy="PACK")
        self.actors = []
        self._encoder, self._decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Reply)
        try:
            ray.get(self.pg.ready(), timeout=envs.KC_READY_TIMEOUT)
            store = StoreActor.options(num_cpus=0).remote()  # type: ignore[attr-defined]  # ray.remote's stub keeps the class type
            self.actors = [RankActor.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(  # type: ignore[attr-defined]
                placement_group=self.pg, placement_group_bundle_index=rank)).remote(config.for_rank(rank), rank, store)
                for rank in range(self.world_size)]
            self.store = store
            ray.get([a.ready.remote() for a in self.actors], timeout=envs.KC_READY_TIMEOUT)
        except BaseException:
            self.shutdown()
            raise
        self.vocab_size = self._call_all(Call("vocab_size"))[0]

    def _call_all(self, message: WorkerRequest) -> list:
        ray = _ray()
        payload = self._encoder.encode(message)
        try:
            replies = [self._decoder.decode(b) for b in ray.get([a.call.remote(payload) for a in self.actors])]
        except ray.exceptions.RayError as exc:
            raise WorkerDiedError(f"a Ray worker failed or died: {exc}") from exc
        for rank, reply in enumerate(replies):
            if reply.error is not None:
                raise WorkerDiedError(f"worker-{rank} failed: {reply.error}")
        return [r.value if r.output is None else r.output for r in replies]

    def determine_num_blocks(self) -> int:
        return min(self._call_all(Call("determine_num_blocks")))

    def initialize_cache(self, num_blocks: int) -> None:
        self._call_all(Call("initialize_cache", num_blocks))

    def execute_model(self, scheduler_output):
        return self._call_all(Execute(scheduler_output))[self.config.parallel.driver_rank]

    def add_lora(self, lora_id: int, path: str) -> None:
        self._call_all(LoraCall(lora_id, path))

    def remove_lora(self, lora_id: int) -> None:
        self._call_all(LoraCall(lora_id))

    def shutdown(self) -> None:
        ray = _ray()
        if self.actors:
            try:
                ray.get([a.call.remote(self._encoder.encode(Call("shutdown"))) for a in self.actors], timeout=30)
            except Exception:
                pass
        for actor in self.actors + ([self.store] if hasattr(self, "store") else []):
            ray.kill(actor)
        self.actors = []
        if getattr(self, "pg", None) is not None:
            self._remove_pg(self.pg)
            self.pg = None
