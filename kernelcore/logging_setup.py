"""One logging format for every process, tagged with the process role.

kernelcore's own loggers and each loaded plugin's top-level package logger
(``logging.getLogger("nova_kc")``) share the handler and ``KC_LOG_LEVEL``.
"""

from __future__ import annotations

import logging

from kernelcore import envs
from kernelcore.hostproc.role import get_role

_plugin_loggers: set[str] = set()  # top-level packages of the loaded plugins
_handler: logging.Handler | None = None


class _RoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.role = get_role()
        return True


def _attach(name: str) -> None:
    logger = logging.getLogger(name)
    if _handler is None or _handler in logger.handlers:
        return
    if name != "kernelcore" and logger.handlers:
        return  # the plugin configured its own logging
    logger.addHandler(_handler)
    logger.setLevel(envs.KC_LOG_LEVEL)
    logger.propagate = False


def configure_logging() -> None:
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.addFilter(_RoleFilter())
        _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(role)s] %(name)s: %(message)s",
                                                "%H:%M:%S"))
    for name in ("kernelcore", *sorted(_plugin_loggers)):
        _attach(name)


def adopt_plugin_logger(name: str) -> None:
    """Route a plugin package's logger like kernelcore's (now, or once logging is configured)."""
    if not name or name == "kernelcore" or not name.isidentifier():
        return
    _plugin_loggers.add(name)
    _attach(name)
