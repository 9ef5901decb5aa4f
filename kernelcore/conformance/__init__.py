"""The conformance kit: ``kc plugins check NAME`` runs these checks against an installed platform plugin.

Run it on a machine where the device is present; the platform named is forced with ``KC_PLATFORM``.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("kernelcore.conformance")


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str


def _run(name: str, fn: Callable[[], str | list[str]]) -> CheckResult:
    try:
        detail = fn()
        return CheckResult(name, True, "; ".join(detail) if isinstance(detail, list) else detail)
    except Exception as exc:
        logger.debug("check %s failed", name, exc_info=True)
        message = str(exc) if isinstance(exc, AssertionError) else traceback.format_exception_only(exc)[-1].strip()
        return CheckResult(name, False, message)


def run_checks(name: str, model: str | None = None) -> list[CheckResult]:
    """Every check, in order; a failing check does not stop the others (unless they need its result)."""
    os.environ["KC_PLATFORM"] = name  # this process and every process it starts use the platform checked
    from kernelcore.conformance import checks, numerics

    results = [_run("detection is cheap and side-effect free", lambda: checks.detection_is_cheap(name))]
    try:
        from kernelcore.platforms import current_platform
    except Exception as exc:
        return results + [CheckResult("platform resolves", False, f"{type(exc).__name__}: {exc}")]
    platform = current_platform

    def load() -> str:
        from kernelcore import platforms, plugins

        platforms.load_general_plugins()
        return f"{sum(r.status == 'loaded' for r in plugins.records())} plugins loaded with platform {name}"

    results.append(_run("plugins load", load))
    results.append(_run("platform hooks are idempotent", lambda: checks.hooks_are_idempotent(platform)))
    backend: list[type] = []

    def resolve() -> str:
        detail, cls = checks.named_classes_resolve(platform, block_size=16)
        backend.extend([cls] if cls else [])
        return detail

    results.append(_run("worker_cls and every named class resolve", resolve))
    if backend:
        block_size = checks._platform_config(platform).cache.block_size
        results.append(_run("attention backend matches reference attention",
                            lambda: numerics.check_attention_backend(backend[0], block_size)))
    results.append(_run("op replacements subclass their op and match forward_native", numerics.check_op_replacements))
    results.append(_run("plugins load the same way in a spawned process", checks.loads_the_same_when_spawned))
    if model is None:
        from kernelcore.models.default_model import ensure_default_model

        model = ensure_default_model()
    results.append(_run("a tiny model's greedy tokens match the CPU platform",
                        lambda: checks.greedy_tokens_match_cpu(model)))
    return results
