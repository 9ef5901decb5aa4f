"""Platform detection and this process's platform (the base class is :class:`kernelcore.contract.platform.Platform`).

``current_platform`` is resolved lazily on first attribute access (PEP 562),
never at ``import kernelcore``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelcore import envs, plugins
from kernelcore.contract.platform import Platform
from kernelcore.contract.targets import resolve_obj_by_qualname

__all__ = ["Detection", "Platform", "choose", "detect_all", "get_current_platform", "is_resolved",
           "load_general_plugins", "resolve_obj_by_qualname", "resolve_platform"]

logger = logging.getLogger("kernelcore.platforms")


@dataclass
class Detection:
    name: str
    dist: str
    is_builtin: bool
    qualname: str | None
    error: str | None = None


def detect_all() -> list[Detection]:
    """Call every loaded platform detector once; a raising one counts as inactive."""
    detections = []
    for record in plugins.load_platform_plugins():
        if record.status != "loaded" or "detect_platform" not in record.hooks:
            continue
        try:
            results = plugins.call_plugin_hook(record.name, "detect_platform")
            qualname = results[0] if results else None
            detections.append(Detection(record.name, record.dist, record.is_builtin, qualname))
        except Exception as exc:
            logger.warning("Platform plugin %s (%s) failed during detection: %s", record.name, record.dist, exc)
            detections.append(Detection(record.name, record.dist, record.is_builtin, None,
                                        f"{type(exc).__name__}: {exc}"))
    return detections


def choose(detections: list[Detection]) -> tuple[Detection, str]:
    """Apply the detection rules; returns the winner and why it won."""
    forced = envs.KC_PLATFORM
    if forced:
        for d in detections:
            if d.name == forced:
                if d.qualname is None:
                    raise RuntimeError(f"KC_PLATFORM={forced}, but that platform plugin is not active "
                                       f"({d.error or 'its device is absent'})")
                return d, f"forced by KC_PLATFORM={forced}"
        raise RuntimeError(f"KC_PLATFORM={forced} names no loaded platform plugin; "
                           f"loaded: {[d.name for d in detections]}")
    active = [d for d in detections if d.qualname]
    oot = [d for d in active if not d.is_builtin]
    if len(oot) >= 2:
        raise RuntimeError(f"Only one out-of-tree platform plugin can be active, but got: {[d.name for d in oot]} "
                           "(uninstall one, block one with KC_BLOCK_PLUGINS, or pick one with KC_PLATFORM)")
    if len(oot) == 1:
        return oot[0], "the only active out-of-tree platform (wins over built-ins)"
    if not active:
        raise RuntimeError(f"No platform is active. Detectors tried: {[d.name for d in detections] or 'none'}; "
                           "is kernelcore installed (its entry points register the built-in platforms)?")
    # Several built-ins (e.g. cuda and cpu): the highest Platform.priority wins, ties by name.
    if len(active) > 1:
        active.sort(key=lambda d: (-getattr(resolve_obj_by_qualname(d.qualname or ""), "priority", 0), d.name))
    return active[0], "built-in platform detected" + (f" (over {[d.name for d in active[1:]]})"
                                                      if len(active) > 1 else "")


def resolve_platform() -> Platform:
    started = time.perf_counter()
    detections = detect_all()
    winner, why = choose(detections)
    cls = resolve_obj_by_qualname(winner.qualname or "")
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        raise TypeError(f"platform plugin {winner.name!r} returned {winner.qualname!r}, "
                        "which is not a Platform subclass")
    platform = cls()
    platform.plugin_name, platform.is_builtin = winner.name, winner.is_builtin
    platform.decision = {"why": why, "detections": [dataclasses.asdict(d) for d in detections]}
    if platform.is_out_of_tree():
        logger.info("Platform plugin %s is activated", winner.name)
    else:
        logger.debug("Automatically detected platform %s (%s)", winner.name, why)
    plugins.register_platform(platform, winner.name)
    plugins.trace_event(envs.KC_TRACE_PLUGINS, hook="platform_resolved", plugins=[winner.name],
                        result=winner.qualname, why=why, duration_ms=round((time.perf_counter() - started) * 1000, 3),
                        ok=True)
    return platform


if TYPE_CHECKING:
    current_platform: Platform  # resolved on first access by __getattr__ below


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module 'kernelcore.platforms' has no attribute {name!r}")


def get_current_platform() -> Platform:
    """This process's platform, resolved (and registered with the plugin manager) on first use."""
    # Held in the per-process plugin state: a forked child resolves (and registers) its own.
    state = plugins.process_state()
    if state.platform is None:
        state.platform = resolve_platform()
    return state.platform


def load_general_plugins() -> Platform:
    """Fix this process's platform, then load the general plugins (once per process); returns the platform."""
    platform = get_current_platform()
    plugins.load_general_plugins(platform)
    return platform


def is_resolved() -> bool:
    return plugins.process_state().platform is not None
