"""CustomOp: in-tree layers with per-platform forwards, replaceable out of tree.

* ``@CustomOp.register("rms_norm")`` names an in-tree op.
* ``@RMSNorm.register_oot`` (or ``CustomOp.register_oot(Cls, name="RMSNorm")``)
  replaces it: constructing ``RMSNorm(...)`` then yields the replacement, which
  must subclass the in-tree class. The key is the in-tree class's name.
* At construction the op dispatches once, by the config's custom-ops list and
  the platform, to ``forward_cuda`` / ``forward_cpu`` / ``forward_oot`` /
  ``forward_native``.
* On an out-of-tree platform the default ``forward_oot`` runs the kernel-table
  path (``forward_cuda``) when the platform overrode every kernel the op
  declares in ``kernel_names``, else ``forward_native``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from kernelcore.contract.config import get_current_config

logger = logging.getLogger("kernelcore.custom_op")

op_registry: dict[str, type[CustomOp]] = {}
op_registry_oot: dict[str, type[CustomOp]] = {}


def _owner(cls: type) -> str:
    """The distribution (or top-level package) that defines a class, for error messages."""
    top = cls.__module__.split(".")[0]
    try:
        import importlib.metadata as md

        dists = md.packages_distributions().get(top)
        if dists:
            return f"{dists[0]} ({cls.__module__}.{cls.__qualname__})"
    except Exception:
        pass
    return f"{cls.__module__}.{cls.__qualname__}"


def _same_definition(a: type, b: type) -> bool:
    # A re-imported module (spawn, reload) defines a new class object with the same path.
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


class CustomOp(torch.nn.Module):
    name: str = ""
    kernel_names: tuple[str, ...] = ()  # kernel-table entries forward_cuda calls

    def __new__(cls, *args: Any, **kwargs: Any):
        replacement = op_registry_oot.get(cls.__name__)
        if replacement is not None and replacement is not cls and issubclass(replacement, cls):
            logger.debug("Instantiating custom op %s using %s", cls.__name__, replacement)
            cls = replacement
        return super().__new__(cls)

    def __init__(self) -> None:
        super().__init__()
        self._forward_method = self.dispatch_forward()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward_native")

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, "_oot_default", self.forward_native)(*args, **kwargs)

    def _uses_overridden_kernels(self) -> bool:
        from kernelcore.kernels import kernel_table

        return bool(self.kernel_names) and all(kernel_table.is_overridden(n) for n in self.kernel_names)

    @property
    def forward_method_name(self) -> str:
        return self._forward_method.__name__

    @classmethod
    def enabled(cls) -> bool:
        custom_ops = get_current_config().custom_ops or ["all"]
        name = cls.name
        is_on = "all" in custom_ops
        if f"+{name}" in custom_ops and f"-{name}" in custom_ops:
            raise ValueError(f"custom op {name!r} is both enabled and disabled in {custom_ops}")
        return (is_on or f"+{name}" in custom_ops) and f"-{name}" not in custom_ops

    def dispatch_forward(self) -> Callable[..., Any]:
        if not self.enabled():
            return self.forward_native
        from kernelcore.platforms import current_platform

        if current_platform.is_out_of_tree():
            self._oot_default = self.forward_cuda if self._uses_overridden_kernels() else self.forward_native
            return self.forward_oot
        if current_platform.device_type == "cuda":
            return self.forward_cuda
        if current_platform.device_type == "cpu":
            return self.forward_cpu
        return self.forward_native

    @classmethod
    def register(cls, name: str) -> Callable[[Any], Any]:
        def decorator(op_cls: Any) -> Any:
            existing = op_registry.get(name)
            if existing is not None and not _same_definition(existing, op_cls):
                raise ValueError(f"custom op name {name!r} is registered twice: by {_owner(existing)} "
                                 f"and by {_owner(op_cls)}")
            op_cls.name = name
            op_registry[name] = op_cls
            return op_cls

        return decorator

    @classmethod
    def register_oot(cls, _decorated_op_cls: type | None = None, *, name: str | None = None):
        """Replace the in-tree op ``name`` (default: the class this is called on)."""
        if isinstance(_decorated_op_cls, str):
            raise TypeError("register_oot takes a class; pass the in-tree name as name=...")
        key = name or cls.__name__
        if key == "CustomOp":
            raise ValueError("register_oot needs the in-tree class: use InTreeOp.register_oot or name=...")

        def decorator(op_cls: type) -> type:
            existing = op_registry_oot.get(key)
            if existing is not None and not _same_definition(existing, op_cls):
                raise ValueError(
                    f"custom op {key!r} is replaced twice: by {_owner(existing)} and by {_owner(op_cls)}; "
                    "block one of the plugins with KC_BLOCK_PLUGINS")
            in_tree = _find_in_tree(key)
            if in_tree is not None and not issubclass(op_cls, in_tree):
                raise TypeError(f"{_owner(op_cls)} replaces {key!r} but does not subclass it")
            op_registry_oot[key] = op_cls
            return op_cls

        return decorator if _decorated_op_cls is None else decorator(_decorated_op_cls)


def _find_in_tree(class_name: str) -> type | None:
    for op_cls in op_registry.values():
        if op_cls.__name__ == class_name:
            return op_cls
    return None


def loaded_modules_with_oot() -> list[str]:
    return sorted({c.__module__ for c in op_registry_oot.values() if c.__module__ in sys.modules})
