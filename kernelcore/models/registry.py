"""This process's model registry (its type is :class:`kernelcore.contract.models.ModelRegistry`)."""

from __future__ import annotations

from kernelcore.contract.models import ModelInfo, ModelRegistry

__all__ = ["ModelInfo", "ModelRegistry", "model_registry"]

model_registry = ModelRegistry()
