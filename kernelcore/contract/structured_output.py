"""The grammar-backend contract: what a plugin implements to serve constrained decoding.

A backend is built once per process from the model's tokenizer and vocabulary size. It compiles a
:class:`StructuredOutputsParams` (JSON Schema, any JSON object, regex, choice or grammar) into a shareable
grammar (kernelcore caches it by the constraint's source), and makes one :class:`GrammarMatcher` per request
from it. Each engine step the matcher writes the allowed next tokens into one row of an int32 bitmask of
shape ``[rows, ceil(vocab / 32)]`` (bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed), the
layout llguidance and xgrammar share.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelcore.contract.structured_output_params import StructuredOutputsParams
from kernelcore.contract.targets import resolve_target


class UnsupportedConstraint(ValueError):
    """The backend does not implement this kind of constraint (``auto`` then tries the next backend)."""


class GrammarMatcher(abc.ABC):
    """One request's position in its grammar."""

    @abc.abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it (the matcher is then unchanged)."""

    @abc.abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (int32, the layout above)."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """True once the output is complete: nothing but end-of-sequence may follow."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""


class StructuredOutputBackend(abc.ABC):
    """A grammar library behind the engine. Constructed as ``factory(tokenizer, vocab_size)``."""

    name: str = "?"

    @abc.abstractmethod
    def compile(self, params: StructuredOutputsParams) -> Any:
        """Compile the constraint (called off the step loop, from a thread; results are cached by kernelcore).

        :raises UnsupportedConstraint: for a kind of constraint this backend does not serve.
        :raises ValueError: when the constraint is invalid (the message reaches the client as a 400).
        """

    @abc.abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of a compiled grammar (cheap; one per request)."""


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed bitmask (every bit set)."""
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


BackendFactory = Callable[[Any, int], StructuredOutputBackend] | str  # or "module:Class", imported on first use


@dataclass(order=True)
class _Entry:
    order: int
    name: str
    factory: BackendFactory = field(compare=False)
    plugin: str | None = field(compare=False, default=None)


class StructuredOutputBackendRegistry:
    """Backends by name; ``auto`` tries them by ascending ``order`` (ties by name)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.owner: str | None = None  # the plugin whose hook is registering (set by the loader: ownership passed)

    def register(self, name: str, factory: BackendFactory, order: int = 50) -> None:
        if name in self._entries:
            raise ValueError(f"structured-output backend {name!r} is registered twice")
        self._entries[name] = _Entry(order, name, factory, self.owner)

    def names(self) -> list[str]:
        return [e.name for e in sorted(self._entries.values())]

    def owners(self) -> dict[str, str | None]:
        return {e.name: e.plugin for e in sorted(self._entries.values())}

    def factory(self, name: str) -> Callable[[Any, int], StructuredOutputBackend]:
        if name not in self._entries:
            raise ValueError(f"unknown structured-output backend {name!r}; "
                             f"installed: {', '.join(self.names()) or 'none'}")
        return resolve_target(self._entries[name].factory)
