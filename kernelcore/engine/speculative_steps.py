"""The scheduler's part in speculative decoding: drafts for the requests that decode this step, and the count of
what verification accepted (mixed into Scheduler)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelcore.engine.request import Request
    from kernelcore.metrics.stats import EngineStats
    from kernelcore.speculative.controller import SpeculativeController
    from kernelcore.structured_output.manager import StructuredOutputManager


class SpeculativeSteps:
    spec: SpeculativeController | None = None  # speculative decoding, when configured
    # the Scheduler's own state, read here
    running: list[Request]
    requests: dict[str, Request]
    in_flight: set[str]
    max_model_len: int
    structured: StructuredOutputManager | None
    _step_stats: EngineStats

    def _propose(self) -> dict[str, list[int]]:
        """Drafts for the running requests that decode this step, within max_tokens, the context and the grammar."""
        assert self.spec is not None
        candidates = []
        for request in self.running:
            if request.request_id in self.in_flight or request.num_computed_tokens != request.num_tokens - 1:
                continue
            # room for the drafts and the token sampled after them
            limit = min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens) - 1
            if limit > 0:
                candidates.append((request.request_id, request.all_token_ids, limit, request.num_prompt_tokens))
        drafts = self.spec.propose(candidates) if candidates else {}
        if self.structured is not None and drafts:
            for request_id in list(drafts):
                checked = self.structured.check_drafts(self.requests[request_id], drafts[request_id])
                if checked:
                    drafts[request_id] = checked
                else:
                    del drafts[request_id]
        return drafts

    def _record_verification(self, request_id: str, drafts: list[int], accepted: list[int]) -> None:
        assert self.spec is not None
        self.spec.record(request_id, len(drafts), len(accepted))
        stats = self._step_stats
        stats.spec_num_drafts += 1
        stats.spec_num_draft_tokens += len(drafts)
        stats.spec_num_accepted_tokens += len(accepted)
        per_pos = stats.spec_accepted_per_pos
        per_pos.extend([0] * (len(drafts) - len(per_pos)))
        for i in range(len(accepted)):
            per_pos[i] += 1
