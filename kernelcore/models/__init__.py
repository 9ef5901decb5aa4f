"""The model-plugin interface: the registry, weight loading and HF config access.

``import kernelcore.models`` imports no torch; the loader helpers are imported on first use.
"""

from __future__ import annotations

from typing import Any

from kernelcore.models.registry import ModelInfo, ModelRegistry, model_registry

_LOADER_NAMES = ("load_params", "default_weight_loader", "iterate_weights")
__all__ = ["ModelInfo", "ModelRegistry", "model_registry", "get_hf_config", *_LOADER_NAMES]


def get_hf_config(config: Any) -> Any:
    """The model's transformers ``PretrainedConfig`` (``hf_overrides`` applied, cached per process).

    :param config: the :class:`~kernelcore.config.KernelConfig` a model class is constructed with.
    """
    from kernelcore.config_builder import load_hf_config

    return load_hf_config(config.model)


def __getattr__(name: str) -> Any:
    if name in _LOADER_NAMES:
        from kernelcore.models import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'kernelcore.models' has no attribute {name!r}")
