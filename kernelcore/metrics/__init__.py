"""Stat loggers: the base class plugins subclass, and the group loader."""

from __future__ import annotations

from typing import Any


class StatLoggerBase:
    """Receives engine statistics once per engine step.

    The engine core computes the statistics each step and sends them with its
    outputs; the loggers run in the front end, beside the API server.

    Subclass it and publish the class in the ``kernelcore.stat_logger_plugins``
    entry-point group. Constructed as ``cls(config)``.
    """

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def record(self, stats: Any) -> None:
        """Called after engine steps with a :class:`kernelcore.metrics.stats.EngineStats`: one per step, or one for
        several steps that had nothing else to send (counters summed, ``iteration_tokens`` per step)."""

    def record_finished(self, request: Any) -> None:
        """Called in the front end when a request finishes, with a
        :class:`kernelcore.metrics.request_stats.FinishedRequestStats`."""

    def log(self) -> None:
        """Called periodically (about every few seconds) to flush or print."""

    def shutdown(self) -> None:
        """Called once when the engine stops."""


def load_stat_logger_plugins() -> list[type[StatLoggerBase]]:
    """The stat-logger classes of the entry-point group; anything else is a TypeError naming the plugin."""
    from kernelcore import plugins

    return validate_stat_loggers(plugins.load_stat_logger_classes())


def validate_stat_loggers(named: list[tuple[str, Any]]) -> list[type[StatLoggerBase]]:
    classes = []
    for name, obj in named:
        if not (isinstance(obj, type) and issubclass(obj, StatLoggerBase)):
            raise TypeError(f"Stat logger plugin {name!r} must be a subclass of kernelcore.metrics.StatLoggerBase (got {obj!r})")
        classes.append(obj)
    return classes


def make_stat_loggers(config: Any, extra: list[StatLoggerBase] | None = None) -> list[StatLoggerBase]:
    """The built-in logging logger, any given loggers (e.g. Prometheus), then every stat-logger plugin."""
    from kernelcore.metrics.logging_logger import LoggingStatLogger

    return [LoggingStatLogger(config), *(extra or []), *(cls(config) for cls in load_stat_logger_plugins())]
