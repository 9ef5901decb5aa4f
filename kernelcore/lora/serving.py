"""The front end's adapters: name -> LoRARequest, validated loads, unloads and resolver lookups (per-name lock).

Where a runtime ``lora_path`` may point: inside ``lora_root`` (``--lora-root``, else ``KC_LORA_RESOLVER_DIR``)
when one is set; with neither set any local directory is accepted (runtime updating is already opt-in) and
start-up logs a warning. Static ``--lora-modules`` are the operator's and are not confined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from kernelcore.lora.adapter import LoRAAdapterError, LoRANotFoundError, load_adapter, log_detail
from kernelcore.lora.resolver import build_registry, confine, resolve

logger = logging.getLogger("kernelcore.lora")


@dataclass(frozen=True)
class LoRARequest:
    name: str
    lora_id: int
    path: str


class LoRAExistsError(ValueError):
    pass


class LoRAUnknownError(KeyError):
    pass


def _same_model(base_model: str | None, names: set[str]) -> bool:
    if not base_model:
        return True
    return base_model in names or os.path.basename(os.path.normpath(base_model)) in names


class LoRAServing:
    def __init__(self, engine: Any, base_model_name: str, lora_root: str | None = None,
                 allow_runtime_updating: bool = False) -> None:
        from kernelcore.config_builder import load_hf_config
        from kernelcore.lora.manager import lora_module_names
        from kernelcore.models.registry import model_registry

        config = engine.config
        self.engine, self.base_model_name = engine, base_model_name
        self.lora_root, self.allow_runtime_updating = lora_root, allow_runtime_updating
        self.max_rank = config.lora.max_lora_rank
        model_dir = config.model.model
        self.base_names = {base_model_name, model_dir, os.path.basename(model_dir.rstrip("/"))}
        hf_config = load_hf_config(config.model)
        _, model_cls = model_registry.resolve(list(getattr(hf_config, "architectures", None) or []))
        self.supported_modules = lora_module_names(model_cls)
        self.adapters: dict[str, LoRARequest] = {}
        self._next_id = 1
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # name -> (lock, number of holders and waiters)
        if allow_runtime_updating and lora_root is None:
            logger.warning("Runtime LoRA loading is on without --lora-root or KC_LORA_RESOLVER_DIR: "
                           "/v1/load_lora_adapter accepts any local directory")

    @contextlib.asynccontextmanager
    async def _name_lock(self, name: str) -> AsyncIterator[None]:
        """One load, unload or resolution per name at a time; the lock is dropped with its last user."""
        lock, num_users = self._locks.get(name, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[name] = (lock, num_users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, num_users = self._locks[name]
            if num_users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, num_users - 1)

    def check(self, path: str) -> None:
        """Read and validate the adapter (raises LoRANotFoundError, LoRAAdapterError; messages carry no path).

        Its tensors' shapes are checked against the model's modules by every worker when the engine adds it."""
        try:
            adapter = load_adapter(path, self.max_rank)
        except LoRANotFoundError:
            raise
        except OSError as exc:
            logger.warning("LoRA adapter at %s cannot be read: %s", path, exc)
            raise LoRAAdapterError(f"the adapter's files cannot be read ({type(exc).__name__})") from None
        unsupported = sorted({name.rsplit(".", 1)[-1] for name in adapter.weights} - self.supported_modules)
        if unsupported:
            raise LoRAAdapterError(f"the adapter targets modules this model cannot adapt: {unsupported}; "
                                   f"supported: {sorted(self.supported_modules)}")
        if not _same_model(adapter.base_model_name, self.base_names):
            raise LoRAAdapterError(f"the adapter was trained for base model {adapter.base_model_name!r}, "
                                   f"not {self.base_model_name!r}")

    async def load(self, name: str, path: str, is_runtime: bool = True) -> LoRARequest:
        if not isinstance(name, str) or not name:
            raise LoRAAdapterError("lora_name is required")
        if not isinstance(path, str) or not path:
            raise LoRAAdapterError("lora_path is required")
        if name == self.base_model_name:
            raise LoRAExistsError(f"The lora adapter '{name}' has the name of the base model.")
        async with self._name_lock(name):
            if name in self.adapters:
                raise LoRAExistsError(f"The lora adapter '{name}' has already been loaded.")
            if is_runtime and self.lora_root is not None:
                path = confine(self.lora_root, path)
            path = os.path.realpath(path)
            try:
                await asyncio.to_thread(self.check, path)
                lora = LoRARequest(name, self._next_id, path)
                self._next_id += 1
                await self.engine.add_lora(lora.lora_id, lora.path, name=lora.name)
            except LoRAAdapterError as exc:
                logger.warning("LoRA adapter %r at %s refused: %s", name, path, log_detail(exc))
                raise
            self.adapters[name] = lora
            logger.info("LoRA adapter %r (id %d) loaded from %s", name, lora.lora_id, path)
            return lora

    async def unload(self, name: str) -> None:
        async with self._name_lock(name):
            lora = self.adapters.pop(name, None)
            if lora is None:
                raise LoRAUnknownError(name)
            await self.engine.remove_lora(lora.lora_id)

    async def get(self, name: str) -> LoRARequest | None:
        """The adapter called ``name``; unknown names go to the resolvers when runtime updating is allowed."""
        lora = self.adapters.get(name)
        if lora is not None or not self.allow_runtime_updating:
            return lora
        async with self._name_lock(name):
            return self.adapters.get(name) or await self._resolve(name)

    async def _resolve(self, name: str) -> LoRARequest | None:
        found = await resolve(build_registry(), self.base_model_name, name)
        if found is None:
            return None
        resolver, path = found
        try:
            await asyncio.to_thread(self.check, path)
            lora = LoRARequest(name, self._next_id, path)
            self._next_id += 1
            await self.engine.add_lora(lora.lora_id, lora.path, name=lora.name)
        except (LoRANotFoundError, LoRAAdapterError) as exc:  # the client's words: the name, never the path
            logger.warning("LoRA adapter %r found by resolver %r at %s refused: %s", name, resolver, path,
                           log_detail(exc))
            raise LoRAAdapterError(f"LoRA adapter '{name}' was found by resolver {resolver!r} but could not be "
                                   f"loaded: {exc}") from exc
        self.adapters[name] = lora
        logger.info("LoRA adapter %r (id %d) resolved by %s: %s", name, lora.lora_id, resolver, path)
        return lora

    def names_by_id(self) -> dict[int, str]:
        return {lora.lora_id: lora.name for lora in self.adapters.values()}
