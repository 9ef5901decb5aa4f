"""Choosing an attention backend: the platform is asked once per distinct selector per process."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from kernelcore.contract.attention import AttentionSelector

if TYPE_CHECKING:
    from kernelcore.attention.backend import AttentionBackend

__all__ = ["AttentionSelector", "get_attn_backend"]


@functools.cache
def get_attn_backend(selector: AttentionSelector) -> type[AttentionBackend]:
    from kernelcore import plugins
    from kernelcore.attention.backend import AttentionBackend
    from kernelcore.platforms import current_platform, resolve_obj_by_qualname

    qualname = plugins.get_plugin_manager().hook.get_attn_backend_cls(selector=selector)
    if not qualname:
        raise RuntimeError(f"platform {current_platform.plugin_name!r} ({type(current_platform).__name__}) "
                           f"names no attention backend for {selector}: implement get_attn_backend_cls")
    cls = resolve_obj_by_qualname(qualname)
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise TypeError(f"get_attn_backend_cls returned {qualname!r}, which is not an AttentionBackend subclass")
    return cls
