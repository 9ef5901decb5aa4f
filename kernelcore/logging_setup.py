"""One logging format for every process, tagged with the process role."""

from __future__ import annotations

import logging

from kernelcore import envs
from kernelcore.hostproc.role import get_role


class _RoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.role = get_role()
        return True


def configure_logging() -> None:
    logger = logging.getLogger("kernelcore")
    if any(getattr(h, "_kc", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler._kc = True
    handler.addFilter(_RoleFilter())
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(role)s] %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(envs.KC_LOG_LEVEL)
    logger.propagate = False
