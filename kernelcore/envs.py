"""KC_* environment variables.

Read through attribute access (``envs.KC_PLUGINS``). Until :func:`freeze` is
called they reflect ``os.environ`` live; after it (at the end of a process's
start-up) every variable is read once and later changes are ignored. A plugin
declares its own with :func:`declare` when its module is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [s.strip() for s in value.split(",") if s.strip()]


def _bool(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


# name -> parser of the raw string (None when unset)
VARIABLES: dict[str, Callable[[str | None], Any]] = {
    "KC_PLUGINS": _csv,  # allow-list of third-party entry-point names (every group); unset = all
    "KC_BLOCK_PLUGINS": lambda v: _csv(v) or [],  # blocked entry-point names, built-ins included
    "KC_PLATFORM": lambda v: (v or "").strip() or None,  # force a platform by entry-point name
    "KC_TRACE_PLUGINS": lambda v: v or None,  # file receiving one JSON line per hook call
    "KC_LOG_LEVEL": lambda v: (v or "INFO").upper(),
    "KC_CACHE_DIR": lambda v: v or os.path.join(os.path.expanduser("~"), ".cache", "kernelcore"),
    "KC_API_KEY": lambda v: v or None,
    "KC_LORA_RESOLVER_DIR": lambda v: v or None,
    "KC_ALLOW_RUNTIME_LORA_UPDATING": _bool,
    "KC_READY_TIMEOUT": lambda v: float(v or 300),
}
OWNERS: dict[str, str] = {name: "kernelcore" for name in VARIABLES}  # name -> who declared it

csv, boolean = _csv, _bool  # parsers for declare()


def declare(name: str, parse: Callable[[str | None], Any], owner: str) -> None:
    """Declare a plugin's variable: ``envs.NAME`` then returns ``parse(os.environ.get(NAME))``.

    Re-declaring by the same owner is a no-op (re-imports); another owner's name is an error.
    """
    if not name.startswith("KC_") or not name.isupper():
        raise ValueError(f"{owner} declares {name!r}: kernelcore variables are upper case and start with KC_")
    if OWNERS.get(name, owner) != owner:
        raise ValueError(f"{owner} declares {name}, which {OWNERS[name]} already declared")
    VARIABLES[name], OWNERS[name] = parse, owner
    if _frozen is not None:
        _frozen[name] = parse(os.environ.get(name))

_frozen: dict[str, Any] | None = None


def __getattr__(name: str) -> Any:
    if name not in VARIABLES:
        raise AttributeError(f"module 'kernelcore.envs' has no variable {name!r}")
    if _frozen is not None:
        return _frozen[name]
    return VARIABLES[name](os.environ.get(name))


def freeze() -> None:
    """Read every variable now; later environment changes are ignored in this process."""
    global _frozen
    _frozen = {name: parse(os.environ.get(name)) for name, parse in VARIABLES.items()}


def unfreeze() -> None:
    """Undo :func:`freeze` (tests)."""
    global _frozen
    _frozen = None


def is_frozen() -> bool:
    return _frozen is not None
