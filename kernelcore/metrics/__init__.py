"""Stat loggers: the group loader (the base class plugins subclass is
:class:`kernelcore.contract.stat_logger.StatLoggerBase`, re-exported here)."""

from __future__ import annotations

from typing import Any

from kernelcore.contract.stat_logger import StatLoggerBase

__all__ = ["StatLoggerBase", "load_stat_logger_plugins", "make_stat_loggers", "validate_stat_loggers"]


def load_stat_logger_plugins() -> list[type[StatLoggerBase]]:
    """The stat-logger classes of the entry-point group; anything else is a TypeError naming the plugin."""
    from kernelcore import plugins

    return validate_stat_loggers(plugins.load_stat_logger_classes())


def validate_stat_loggers(named: list[tuple[str, Any]]) -> list[type[StatLoggerBase]]:
    classes = []
    for name, obj in named:
        if not (isinstance(obj, type) and issubclass(obj, StatLoggerBase)):
            raise TypeError(f"Stat logger plugin {name!r} must be a subclass of kernelcore.metrics.StatLoggerBase "
                            f"(got {obj!r})")
        classes.append(obj)
    return classes


def make_stat_loggers(config: Any, extra: list[StatLoggerBase] | None = None) -> list[StatLoggerBase]:
    """The built-in logging logger, any given loggers (e.g. Prometheus), then every stat-logger plugin."""
    from kernelcore.metrics.logging_logger import LoggingStatLogger

    return [LoggingStatLogger(config), *(extra or []), *(cls(config) for cls in load_stat_logger_plugins())]
