"""Attention metadata for a flattened batch, the backend base class and the backend selector."""

from kernelcore.attention.backend import AttentionBackend, AttentionImpl
from kernelcore.attention.metadata import AttentionMetadata
from kernelcore.attention.selector import AttentionSelector, get_attn_backend

__all__ = ["AttentionBackend", "AttentionImpl", "AttentionMetadata", "AttentionSelector", "get_attn_backend"]
