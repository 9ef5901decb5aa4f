"""Errors shared by the engine core, executors, workers and plugins."""

from __future__ import annotations


class RequestStateError(ValueError):
    """Caused by one request's own state (its adapter, grammar, logits processor), raised before any collective.

    It fails that request (or that call) alone: the worker, the other ranks and the other requests in the batch are
    unaffected and the engine keeps serving. Its message is meant for the client: no paths or internals.
    """


class WorkerDiedError(RuntimeError):
    """A worker (process, host or connection) died or failed; the engine cannot continue."""
