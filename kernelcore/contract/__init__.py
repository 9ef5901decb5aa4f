"""The plugin contract: everything a plugin may touch, on the bottom floor of kernelcore.

This package imports nothing of kernelcore outside itself, so a plugin author reads it alone:

* :mod:`~kernelcore.contract.hookspecs`: every hook, documented (docs/hooks.md is generated from it): the
  platform hooks (:mod:`~kernelcore.contract.platform_hooks`), the general ones
  (:mod:`~kernelcore.contract.general_hooks`) and the pluggy markers (:mod:`~kernelcore.contract.markers`);
* the registry types the registration hooks hand to plugins, plain containers with ``register(...)``:
  :mod:`~kernelcore.contract.models`, :mod:`~kernelcore.contract.kernels`, :mod:`~kernelcore.contract.quantization`,
  :mod:`~kernelcore.contract.executors`, :mod:`~kernelcore.contract.lora`,
  :mod:`~kernelcore.contract.structured_output`, :mod:`~kernelcore.contract.parsers`,
  :mod:`~kernelcore.contract.speculative`;
* the value types hooks mention: :mod:`~kernelcore.contract.config` (``KernelConfig``),
  :mod:`~kernelcore.contract.attention` (``AttentionSelector``), :mod:`~kernelcore.contract.platform` (the
  ``Platform`` base class), :mod:`~kernelcore.contract.structured_output_params`;
* the base class of the ``kernelcore.stat_logger_plugins`` group: :mod:`~kernelcore.contract.stat_logger`;
* this module: the contract's version and the deprecation path for hooks and public names.

The code that calls the hooks and fills the registries lives above: the plugin machinery
(:mod:`kernelcore.plugins`, :mod:`kernelcore.platforms`) and each subsystem's loader.

``CONTRACT_VERSION`` is (major, minor). A plugin built for N.m works on every N.m' with m' >= m:
minor versions only add (hooks, hook parameters, public names); a removal or an incompatible change
bumps the major version. A deprecated hook or name keeps working for one minor version and warns.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

CONTRACT_VERSION: tuple[int, int] = (1, 1)


class ContractVersionError(RuntimeError):
    """The running kernelcore does not offer the contract a plugin was built for."""


def require_contract(version: str, plugin: str = "a plugin") -> None:
    """Raise unless this kernelcore offers contract ``version`` ("1.0"); plugins call it at import time."""
    try:
        major, minor = (int(part) for part in version.split("."))
    except ValueError:
        raise ValueError(f"contract version must be 'MAJOR.MINOR', got {version!r}") from None
    have_major, have_minor = CONTRACT_VERSION
    if major != have_major or minor > have_minor:
        raise ContractVersionError(f"{plugin} needs kernelcore plugin contract {version}, but this kernelcore offers "
                                   f"{have_major}.{have_minor}")


class KernelcoreDeprecationWarning(DeprecationWarning):
    """A hook or public name that goes away in the next minor contract version."""


def deprecated_hook_warning(hook: str, instead: str, removed_in: str) -> KernelcoreDeprecationWarning:
    """The ``warn_on_impl`` value of a deprecated hookspec: ``@hookspec(warn_on_impl=deprecated_hook_warning(...))``.

    pluggy then warns when a plugin implementing the hook is registered.
    """
    return KernelcoreDeprecationWarning(f"the hook {hook!r} is deprecated and will be removed in contract "
                                        f"{removed_in}: implement {instead!r} instead")


def deprecated_names(module_name: str, renamed: dict[str, tuple[str, Callable[[], Any]]],
                     removed_in: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves old public names with a warning.

    ``renamed`` maps an old name to (its new dotted name, a function returning the object).
    """

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        new_name, get = renamed[name]
        warnings.warn(f"{module_name}.{name} is deprecated and will be removed in contract {removed_in}: "
                      f"use {new_name}", KernelcoreDeprecationWarning, stacklevel=2)
        return get()

    return __getattr__
