"""Importing what a plugin names by a dotted path (``"pkg.mod.Name"`` or ``"pkg.mod:Name"``), on first use."""

from __future__ import annotations

import importlib
from typing import Any


def resolve_obj_by_qualname(qualname: str) -> Any:
    """The object a dotted path names, its module imported now."""
    module_name, _, obj_name = qualname.rpartition(".")
    if ":" in qualname:
        module_name, _, obj_name = qualname.partition(":")
    if not module_name:
        raise ValueError(f"{qualname!r} is not a dotted path 'pkg.mod.Name'")
    return getattr(importlib.import_module(module_name), obj_name)


def resolve_target(target: Any) -> Any:
    """A registered class or factory as given, or imported when it was registered as its dotted path."""
    return resolve_obj_by_qualname(target) if isinstance(target, str) else target
