"""Choosing a backend for a constraint and compiling it once per source (thread-safe, cached)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from kernelcore.contract.structured_output_params import StructuredOutputsParams
from kernelcore.structured_output.backend import (
    StructuredOutputBackend,
    StructuredOutputBackendRegistry,
    UnsupportedConstraint,
    build_registry,
)

logger = logging.getLogger("kernelcore.structured_output")
CACHE_SIZE = 256


class GrammarCompiler:
    """``compile(params) -> (backend, compiled)``; ``choice`` is ``"auto"`` or a backend name.

    ``auto`` tries the backends by order and moves to the next on :class:`UnsupportedConstraint`;
    a backend named in ``params.backend`` (the one the front end validated with) is used directly.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, choice: str = "auto",
                 registry: StructuredOutputBackendRegistry | None = None) -> None:
        if tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer, and this model has none")
        self.tokenizer, self.vocab_size, self.choice = tokenizer, vocab_size, choice
        self.registry = registry or build_registry()
        names = self.registry.names()
        if choice != "auto" and choice not in names:
            raise ValueError(f"--structured-outputs-backend {choice!r} is not installed; installed: "
                             f"{', '.join(names) or 'none'}")
        self._backends: dict[str, StructuredOutputBackend] = {}
        self._cache: OrderedDict[tuple, tuple[StructuredOutputBackend, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def backend(self, name: str) -> StructuredOutputBackend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = self.registry.factory(name)(self.tokenizer, self.vocab_size)
            return self._backends[name]

    def candidates(self, params: StructuredOutputsParams) -> list[str]:
        if params.backend:
            return [params.backend]
        return self.registry.names() if self.choice == "auto" else [self.choice]

    def compile(self, params: StructuredOutputsParams) -> tuple[StructuredOutputBackend, Any]:
        key = (params.backend or self.choice, params.cache_key)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        names = self.candidates(params)
        if not names:
            raise ValueError("no structured-output backend is installed")
        unsupported = []
        for name in names:
            backend = self.backend(name)
            try:
                compiled = backend.compile(params)
            except UnsupportedConstraint as exc:
                unsupported.append(f"{name}: {exc}")
                continue
            with self._lock:
                self._cache[key] = (backend, compiled)
                if len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            return backend, compiled
        raise ValueError("no structured-output backend supports this request (" + "; ".join(unsupported) + ")")
