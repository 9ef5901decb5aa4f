"""The worker's LoRA state: adapter paths by id, a CPU LRU cache of loaded adapters, ``max_loras`` slots.

Every TP rank holds one manager; the engine core broadcasts ``add_lora(id, path)`` and each rank reads the
adapter from disk itself (nothing a client sent is unpickled) and checks every tensor against the modules it
targets, so a bad adapter is refused when it is added. Adapters are loaded into a slot when a step needs them
(read again from disk when the CPU cache dropped them); one that cannot be loaded then fails only the
requests that use it (:meth:`LoRAModelManager.prepare_step`). A slot not needed by the current step is reused
least-recently-used first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.contract.config import KernelConfig
from kernelcore.distributed import get_tp_group
from kernelcore.forward_context import get_forward_context
from kernelcore.layers.linear import LinearBase
from kernelcore.lora.adapter import LoRAAdapter, LoRAAdapterError, check_shapes, load_adapter, log_detail
from kernelcore.lora.layers import LoRALinear, full_features

logger = logging.getLogger("kernelcore.lora")


def lora_module_names(model_cls: type) -> set[str]:
    """The PEFT target-module names a model supports (packed modules expanded: qkv_proj -> q_proj, ...)."""
    packed = getattr(model_cls, "packed_modules_mapping", {})
    return {sub for name in getattr(model_cls, "supported_lora_modules", ()) for sub in packed.get(name, [name])}


class LoRAModelManager:
    def __init__(self, model: nn.Module, config: KernelConfig) -> None:
        lora = config.lora
        self.num_slots, self.max_rank, self.max_cpu_loras = lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras
        self.paths: dict[int, str] = {}
        self.cpu_cache: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self.slot_ids: list[int | None] = [None] * self.num_slots
        self.slot_lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(self.num_slots))  # front = reused first
        weight = next(model.parameters())
        self.dtype = weight.dtype
        self.slot_scaling = torch.zeros(self.num_slots + 1, dtype=self.dtype, device=weight.device)  # 0 = base model
        self.targets: dict[str, tuple[LoRALinear, int]] = {}  # PEFT module path -> (layer, slice index)
        self.layers = self._wrap(model)
        self.features = {name: full_features(layer.base, i) for name, (layer, i) in self.targets.items()}
        self._ids: torch.Tensor | None = None
        self._scales: torch.Tensor | None = None

    def _wrap(self, model: nn.Module) -> list[LoRALinear]:
        supported = set(getattr(type(model), "supported_lora_modules", ()))
        packed = getattr(model, "packed_modules_mapping", {})
        shard_ids = {sub: shard for _, sub, shard in getattr(model, "stacked_params_mapping", [])}
        layers = []
        for name, module in list(model.named_modules()):
            parent_name, _, leaf = name.rpartition(".")
            if leaf not in supported or not isinstance(module, LinearBase):
                continue
            subs = packed.get(leaf, [leaf])
            layer = LoRALinear(module, [shard_ids.get(s) if len(subs) > 1 else None for s in subs], self.num_slots,
                               self.max_rank, self.token_scales)
            setattr(model.get_submodule(parent_name) if parent_name else model, leaf, layer)
            for i, sub in enumerate(subs):
                self.targets[f"{parent_name}.{sub}" if parent_name else sub] = (layer, i)
            layers.append(layer)
        if not layers:
            raise ValueError(f"{type(model).__name__} declares no supported_lora_modules: it cannot serve LoRA")
        return layers

    def token_scales(self) -> torch.Tensor | None:
        """[num_tokens, num_slots]: each token's slot scaling on its own slot (computed once per step)."""
        ids = get_forward_context().token_lora_ids
        if ids is None:
            return None
        if ids is not self._ids:
            self._ids = ids
            ids = ids.to(self.slot_scaling.device)
            self._scales = F.one_hot(ids, self.num_slots + 1)[:, 1:].to(self.dtype) * self.slot_scaling[1:]
        return self._scales

    # -- adapters -----------------------------------------------------------------------------------------------

    def add_lora(self, lora_id: int, path: str) -> None:
        """Register and check the adapter at ``path`` (LoRANotFoundError, LoRAAdapterError: nothing is kept)."""
        if self.paths.get(lora_id) != path:
            self.remove_lora(lora_id)
        self.paths[lora_id] = path
        try:
            self.get_adapter(lora_id)
        except BaseException:
            self.paths.pop(lora_id, None)
            raise

    def remove_lora(self, lora_id: int) -> None:
        self.paths.pop(lora_id, None)
        self.cpu_cache.pop(lora_id, None)
        if lora_id in self.slot_ids:
            self._clear_slot(self.slot_ids.index(lora_id))

    def get_adapter(self, lora_id: int) -> LoRAAdapter:
        adapter = self.cpu_cache.get(lora_id)
        if adapter is None:
            if lora_id not in self.paths:
                raise LoRAAdapterError(f"LoRA adapter id {lora_id} was never added to this worker")
            path = self.paths[lora_id]
            try:
                adapter = load_adapter(path, self.max_rank)
                check_shapes(adapter, self.features)
            except OSError as exc:  # LoRANotFoundError, or the files went away: the client sees no path
                logger.warning("LoRA adapter id %d at %s cannot be read: %s", lora_id, path, exc)
                raise LoRAAdapterError(f"the adapter's files cannot be read ({type(exc).__name__})") from exc
            except LoRAAdapterError as exc:
                logger.warning("LoRA adapter id %d at %s refused: %s", lora_id, path, log_detail(exc))
                raise
            self.cpu_cache[lora_id] = adapter
            while len(self.cpu_cache) > self.max_cpu_loras:
                self.cpu_cache.popitem(last=False)
        self.cpu_cache.move_to_end(lora_id)
        return adapter

    def _load_slot(self, slot: int, lora_id: int) -> None:
        adapter = self.get_adapter(lora_id)
        pairs: dict[LoRALinear, list] = {layer: [None] * len(layer.shard_ids) for layer in self.layers}
        for name, pair in adapter.weights.items():
            layer, index = self.targets[name]
            pairs[layer][index] = pair
        for layer, layer_pairs in pairs.items():
            layer.set_slot(slot, layer_pairs)
        self.slot_ids[slot] = lora_id
        self.slot_scaling[slot + 1] = adapter.scaling

    def _clear_slot(self, slot: int) -> None:
        self.slot_ids[slot] = None
        self.slot_scaling[slot + 1] = 0
        for layer in self.layers:
            layer.clear_slot(slot)
        self.slot_lru.move_to_end(slot, last=False)

    def _free_slot(self, needed: set[int]) -> int:
        return next(s for s in self.slot_lru if self.slot_ids[s] not in needed)

    def prepare_step(self, lora_ids: list[int]) -> dict[int, str]:
        """Load every adapter of this step into a slot, before the forward; returns the adapters that cannot be
        used (id -> reason for the client): their requests are left out of the step, the others run.

        Every tensor-parallel rank reaches the same verdict (one small all-reduce, only when a step loads
        adapters), so the ranks always run the same batch."""
        needed = set(lora_ids) - {0}
        if len(needed) > self.num_slots:
            raise RuntimeError(f"a step needs {len(needed)} LoRA adapters but max_loras is {self.num_slots}")
        missing = sorted(needed - set(self.slot_ids))
        failed: dict[int, str] = {}
        for lora_id in missing:
            slot = self._free_slot(needed)
            try:
                self._load_slot(slot, lora_id)
            except LoRAAdapterError as exc:
                self._clear_slot(slot)
                failed[lora_id] = str(exc)
        tp = get_tp_group()
        if missing and tp.world_size > 1:
            flags = torch.tensor([float(i in failed) for i in missing], device=self.slot_scaling.device)
            flags = tp.all_reduce(flags)
            for lora_id, flag in zip(missing, flags.tolist(), strict=True):
                if flag and lora_id not in failed:
                    self._clear_slot(self.slot_ids.index(lora_id))
                    failed[lora_id] = "the adapter could not be loaded on every tensor-parallel rank"
        return failed

    def activate(self, lora_ids: list[int]) -> list[int]:
        """Put every adapter of this step in a slot; returns each entry's adapter index (slot + 1, 0 = base)."""
        needed = set(lora_ids) - {0}
        if len(needed) > self.num_slots:
            raise RuntimeError(f"a step needs {len(needed)} LoRA adapters but max_loras is {self.num_slots}")
        slot_of = {lora_id: slot for slot, lora_id in enumerate(self.slot_ids) if lora_id in needed}
        for lora_id in needed - set(slot_of):
            slot = self._free_slot(needed)
            self._load_slot(slot, lora_id)
            slot_of[lora_id] = slot
        for slot in slot_of.values():
            self.slot_lru.move_to_end(slot)
        return [slot_of[i] + 1 if i else 0 for i in lora_ids]
