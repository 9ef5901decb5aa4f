"""The in-memory response store: what ``GET /v1/responses/{id}`` and ``previous_response_id`` read.

One store per server process (per API server in a multi-server deployment), lost at restart. It holds at most
``max_size`` responses; storing one more evicts the least recently *stored* finished response first (reading a
response does not renew it). Background responses still running are never evicted, so the store may exceed
its bound by the number running at once. ``store: false`` responses are never put here.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED = 1000


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object, as GET returns it
    context: list[dict[str, Any]]  # the input items the model saw (previous responses' first), without instructions
    task: asyncio.Task | None = None  # a background response's run
    events: Any = None  # while it runs: its ResponseEvents, whose output items grow

    @property
    def is_running(self) -> bool:
        return self.task is not None and not self.task.done()


class ResponseStore:
    def __init__(self, max_size: int = MAX_STORED) -> None:
        if max_size < 1:
            raise ValueError("the response store must hold at least one response")
        self.max_size = max_size
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.response["id"]] = entry
        self._entries.move_to_end(entry.response["id"])
        excess = len(self._entries) - self.max_size
        for response_id in [i for i, e in self._entries.items() if not e.is_running][:max(excess, 0)]:
            del self._entries[response_id]

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def pop(self, response_id: str) -> StoredResponse | None:
        return self._entries.pop(response_id, None)

    def running(self) -> list[StoredResponse]:
        return [entry for entry in self._entries.values() if entry.is_running]
