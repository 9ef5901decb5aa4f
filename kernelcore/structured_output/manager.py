"""The engine core's side of constrained decoding.

Grammars compile on a thread, so a request waiting for its grammar stays in the waiting queue without
holding up the batch; every compiled grammar is cached by its source. Each step builds one bitmask for the
constrained rows that sample, computed once here (not per tensor-parallel rank) and shipped with the
scheduler output; accepted tokens advance each request's matcher. Preemption recomputes the KV cache but
keeps the sampled tokens, so a matcher's state stays valid across it.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from typing import Any

from kernelcore.structured_output.backend import GrammarMatcher, allocate_bitmask

logger = logging.getLogger("kernelcore.structured_output")


class RequestGrammar:
    """A request's matcher; inactive until ``start_after`` (a reasoning model's end-of-thinking tokens) appears."""

    __slots__ = ("matcher", "start_after", "is_active", "is_failed")

    def __init__(self, matcher: GrammarMatcher, start_after: list[int] | None) -> None:
        self.matcher, self.start_after = matcher, list(start_after or ())
        self.is_active, self.is_failed = not self.start_after, False


class StructuredOutputManager:
    def __init__(self, config: Any, vocab_size: int) -> None:
        self.config, self.vocab_size = config, vocab_size
        self._compiler = None
        self._executor: cf.ThreadPoolExecutor | None = None
        self._pending: dict[str, cf.Future] = {}
        self.grammars: dict[str, RequestGrammar] = {}
        self.errors: dict[str, str] = {}  # request id -> why its grammar could not be built
        self.mask_seconds = 0.0  # time spent filling bitmasks (benchmarks read it)
        self.num_masks = 0

    # -- compilation (off the step loop) --------------------------------------------------------------------

    def compiler(self):
        if self._compiler is None:
            from kernelcore.engine.tokenizer import get_tokenizer
            from kernelcore.structured_output.compiler import GrammarCompiler

            model = self.config.model
            self._compiler = GrammarCompiler(get_tokenizer(model.tokenizer or model.model), self.vocab_size,
                                             self.config.decoding.structured_outputs_backend)
        return self._compiler

    def add_request(self, request: Any) -> None:
        params = request.sampling_params.structured_outputs
        if params is None:
            return
        if self._executor is None:
            self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kc-grammar")
        self._pending[request.request_id] = self._executor.submit(lambda: self.compiler().compile(params))

    def is_ready(self, request: Any) -> bool:
        """False while the request's grammar compiles (or when it failed: see ``errors``)."""
        future = self._pending.get(request.request_id)
        if future is None:
            return request.request_id not in self.errors
        if not future.done():
            return False
        del self._pending[request.request_id]
        try:
            backend, compiled = future.result()
            grammar = RequestGrammar(backend.matcher(compiled),
                                     request.sampling_params.structured_outputs.start_after_token_ids)
        except Exception as exc:
            self.errors[request.request_id] = str(exc) or type(exc).__name__
            return False
        self.grammars[request.request_id] = grammar
        for token_id in request.output_token_ids:  # a request that already has output (none today) replays it
            self.accept_token(request, token_id)
        return True

    def has_pending(self) -> bool:
        return bool(self._pending)

    def wait_for_compilation(self, timeout: float) -> None:
        """Block until some grammar finishes compiling (when nothing else can run)."""
        cf.wait(list(self._pending.values()), timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def pop_errors(self) -> dict[str, str]:
        errors, self.errors = self.errors, {}
        return errors

    def remove(self, request_id: str) -> None:
        self.grammars.pop(request_id, None)
        future = self._pending.pop(request_id, None)
        if future is not None:
            future.cancel()

    # -- each step ----------------------------------------------------------------------------------------------

    def bitmask(self, request_ids: list[str],
                drafts: dict[str, list[int]] | None = None) -> tuple[list[str], bytes]:
        """The bitmask rows (int32, little-endian bytes) of the given sampling requests that are constrained; a
        request with ``drafts`` (checked by ``check_drafts``) gets one row per position: before each draft and
        after the last."""
        drafts = drafts or {}
        rows = [r for r in request_ids if (g := self.grammars.get(r)) is not None and g.is_active and not g.is_failed]
        if not rows:
            return [], b""
        started = time.perf_counter()
        row_ids = [r for r in rows for _ in range(1 + len(drafts.get(r, ())))]
        mask = allocate_bitmask(len(row_ids), self.vocab_size)
        row = 0
        for request_id in rows:
            matcher = self.grammars[request_id].matcher
            matcher.fill_bitmask(mask, row)
            row += 1
            accepted = 0
            for token_id in drafts.get(request_id, ()):
                if not matcher.accept_token(token_id):  # check_drafts let it through: cannot happen
                    raise RuntimeError(f"request {request_id}: a checked draft token {token_id} was refused")
                accepted += 1
                matcher.fill_bitmask(mask, row)
                row += 1
            if accepted:
                matcher.rollback(accepted)
        self.mask_seconds += time.perf_counter() - started
        self.num_masks += 1
        return row_ids, mask.numpy().tobytes()

    def check_drafts(self, request: Any, drafts: list[int]) -> list[int]:
        """The longest prefix of ``drafts`` the request's grammar allows (stopping where it completes); for a
        grammar that waits for its start tokens, the drafts before the one that would start it."""
        grammar = self.grammars.get(request.request_id)
        if grammar is None or grammar.is_failed or not drafts:
            return drafts
        if not grammar.is_active:
            n = len(grammar.start_after)
            tail = request.all_token_ids[-n:]
            for j in range(len(drafts)):
                if (tail + drafts[:j + 1])[-n:] == grammar.start_after:
                    return drafts[:j]
            return drafts
        matcher, kept = grammar.matcher, 0
        for token_id in drafts:
            if matcher.is_terminated() or not matcher.accept_token(token_id):
                break
            kept += 1
        if kept:
            matcher.rollback(kept)
        return drafts[:kept]

    def accept_token(self, request: Any, token_id: int) -> bool:
        """Advance the request's matcher; True when the grammar is complete (the request should stop)."""
        grammar = self.grammars.get(request.request_id)
        if grammar is None or grammar.is_failed:
            return False
        if not grammar.is_active:
            n = len(grammar.start_after)
            grammar.is_active = request.all_token_ids[-n:] == grammar.start_after
            return False
        if not grammar.matcher.accept_token(token_id):
            logger.warning("request %s: sampled token %d is not allowed by its grammar; constraint dropped",
                           request.request_id, token_id)
            grammar.is_failed = True
            return False
        return grammar.matcher.is_terminated()

