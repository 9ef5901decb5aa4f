"""LoRA resolvers: plugins that turn an unknown model name into a local adapter directory.

Order (a contract): resolvers are tried by ascending ``order`` (default 50), ties by resolver name; the first
that returns a path wins. The built-ins register ``filesystem`` at 10 (local, cheap) and ``hf_hub`` at 90
(network, last). The registry is rebuilt from the ``register_lora_resolvers`` hook on every lookup, so a
resolver or its configuration is never snapshotted at start-up. A plugin whose hook raises is logged by name
and skipped; a resolver that raises is reported by name (HTTP 400), never swallowed silently.
"""

from __future__ import annotations

import inspect
import logging
import os

from kernelcore.contract.lora import DEFAULT_ORDER, LoRAPathError, LoRAResolver, LoRAResolverError, LoRAResolverRegistry

__all__ = ["DEFAULT_ORDER", "LoRAPathError", "LoRAResolver", "LoRAResolverError", "LoRAResolverRegistry",
           "build_registry", "check_plain_name", "child_of", "confine", "resolve"]

logger = logging.getLogger("kernelcore.lora")

def build_registry() -> LoRAResolverRegistry:
    """A fresh registry from every general plugin's ``register_lora_resolvers`` (each plugin isolated)."""
    from kernelcore import plugins

    registry = LoRAResolverRegistry()
    for impl in plugins.get_plugin_manager().hook.register_lora_resolvers.get_hookimpls():
        registry.plugin = impl.plugin_name
        try:
            plugins.call_plugin_hook(impl.plugin_name, "register_lora_resolvers", registry=registry)
        except Exception as exc:
            logger.error("LoRA resolver plugin %r failed and is skipped: %s: %s", impl.plugin_name,
                         type(exc).__name__, exc)
    registry.plugin = "<direct call>"
    return registry


async def resolve(registry: LoRAResolverRegistry, base_model_name: str, lora_name: str) -> tuple[str, str] | None:
    """(resolver name, adapter directory) from the first resolver that knows ``lora_name``, or None."""
    for entry in registry.ordered():
        try:
            path = entry.resolver.resolve_lora(base_model_name, lora_name)
            if inspect.isawaitable(path):
                path = await path
        except Exception as exc:
            raise LoRAResolverError(f"LoRA resolver {entry.name!r} (plugin {entry.plugin!r}) failed for adapter "
                                    f"{lora_name!r}: {type(exc).__name__}: {exc}") from exc
        if path is not None:
            return entry.name, str(path)
    return None


# -- path confinement -----------------------------------------------------------------------------------------


def check_plain_name(name: str) -> None:
    """A single plain path component: no separators, no ``.``/``..``, not absolute, no NUL."""
    if not isinstance(name, str) or not name:
        raise LoRAPathError("the LoRA adapter name is empty")
    if "\x00" in name or "/" in name or "\\" in name or name in (".", "..") or os.path.isabs(name):
        raise LoRAPathError(f"LoRA adapter name {name!r} must be a single plain directory name (no '/', '\\\\', "
                            "'..', absolute paths or NUL)")


def confine(root: str, path: str) -> str:
    """``path`` with symlinks resolved, if it lies inside ``root`` (also resolved); else LoRAPathError."""
    if "\x00" in path:
        raise LoRAPathError("the LoRA path contains a NUL byte")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, path))
    if os.path.commonpath([real_root, real]) != real_root:
        raise LoRAPathError(f"LoRA path {path!r} is outside the adapter root")  # the root is not the client's
    return real


def child_of(root: str, name: str) -> str:
    check_plain_name(name)
    return confine(root, name)
