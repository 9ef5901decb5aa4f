"""The model registry's type: architecture name -> model class, eager or lazy, with owners (what
``register_models`` receives; the process's registry is ``kernelcore.models.registry.model_registry``)."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from functools import cached_property

from kernelcore.contract.kernels import OwnedView

logger = logging.getLogger("kernelcore.models")


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    is_text_generation: bool
    supports_lora: bool
    supports_tensor_parallel: bool

    @classmethod
    def inspect(cls, architecture: str, model_cls: type) -> ModelInfo:
        return cls(
            architecture=architecture,
            is_text_generation=callable(getattr(model_cls, "compute_logits", None)),
            supports_lora=bool(getattr(model_cls, "supports_lora", False)),
            supports_tensor_parallel=bool(getattr(model_cls, "supports_tensor_parallel", False)),
        )


class _Entry:
    def __init__(self, architecture: str, target: type | str, owner: str) -> None:
        self.architecture, self.target, self.owner = architecture, target, owner
        self.is_lazy = isinstance(target, str)
        if not self.is_lazy:
            _ = self.info  # the class form is inspected now

    @cached_property
    def model_cls(self) -> type:
        if isinstance(self.target, type):
            return self.target
        module_name, _, class_name = self.target.partition(":")
        return getattr(importlib.import_module(module_name), class_name)

    @cached_property
    def info(self) -> ModelInfo:
        return ModelInfo.inspect(self.architecture, self.model_cls)


class ModelRegistry:
    OWNED_METHODS = ("register_model",)

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.overridden: list[tuple[str, str, str]] = []  # (arch, previous owner, new owner)

    def owned_by(self, owner: str) -> ModelRegistry:
        return OwnedView(self, owner)  # type: ignore[return-value]

    def register_model(self, architecture: str, model_cls: type | str, owner: str = "<direct call>") -> None:
        """Map an HF architecture name to a model class, or to ``"module:Class"`` (imported on first use)."""
        if not isinstance(architecture, str) or not architecture:
            raise TypeError(f"architecture must be a non-empty string, got {architecture!r}")
        if isinstance(model_cls, str):
            module_name, sep, class_name = model_cls.partition(":")
            if not sep or not module_name or not class_name:
                raise ValueError(f"Expected a string in the format '<module>:<class>', got {model_cls!r}")
        elif not isinstance(model_cls, type):
            raise TypeError(f"model_cls must be a class or 'module:Class', got {model_cls!r}")
        previous = self._entries.get(architecture)
        if previous is not None and previous.owner != owner:
            logger.warning("Model architecture %s from plugin %s is overridden by plugin %s (last registration wins)",
                           architecture, previous.owner, owner)
            self.overridden.append((architecture, previous.owner, owner))
        self._entries[architecture] = _Entry(architecture, model_cls, owner)

    def get_supported_archs(self) -> list[str]:
        return sorted(self._entries)

    def owners(self) -> dict[str, str]:
        return {arch: entry.owner for arch, entry in sorted(self._entries.items())}

    def is_lazy(self, architecture: str) -> bool:
        return self._entry(architecture).is_lazy

    def is_imported(self, architecture: str) -> bool:
        return "model_cls" in self._entry(architecture).__dict__

    def inspect(self, architecture: str) -> ModelInfo:
        return self._entry(architecture).info

    def get_model_cls(self, architecture: str) -> type:
        return self._entry(architecture).model_cls

    def resolve(self, architectures: list[str]) -> tuple[str, type]:
        """The first of ``architectures`` that is registered, with its class."""
        for arch in architectures:
            if arch in self._entries:
                return arch, self.get_model_cls(arch)
        raise self._unknown(architectures)

    def _entry(self, architecture: str) -> _Entry:
        try:
            return self._entries[architecture]
        except KeyError:
            raise self._unknown([architecture]) from None

    def _unknown(self, architectures: list[str]) -> ValueError:
        known = ", ".join(f"{a} (plugin {o})" for a, o in self.owners().items()) or "none"
        return ValueError(f"Model architectures {architectures} are not supported. Registered: {known}")
