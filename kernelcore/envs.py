"""KC_* environment variables.

Read through attribute access (``envs.KC_PLUGINS``). Until :func:`freeze` is
called they reflect ``os.environ`` live; after it (at the end of a process's
start-up) every variable is read once and later changes are ignored.
"""

from __future__ import annotations

import os
from typing import Any, Callable


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
    "KC_LORA_HF_REPOS": _csv,
    "KC_ALLOW_RUNTIME_LORA_UPDATING": _bool,
    "KC_READY_TIMEOUT": lambda v: float(v or 300),
    "KC_CPU_NATIVE_KERNELS": lambda v: v is None or _bool(v),  # 0 = the CPU platform uses torch ops only
}

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
