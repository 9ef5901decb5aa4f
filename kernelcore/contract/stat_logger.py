"""The stat-logger base class: what a plugin of the ``kernelcore.stat_logger_plugins`` entry-point group publishes."""

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
