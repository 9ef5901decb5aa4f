"""WorkerBase: one per rank. Keeps each request's token and sampling state, turns a SchedulerOutput into
model-runner entries, runs one forward per step and (on rank 0) samples."""

from __future__ import annotations

import collections
import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from kernelcore.contract.config import KernelConfig
from kernelcore.core_types.runner_output import ModelRunnerOutput, TokenLogprobs
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.core_types.scheduler_output import SchedulerOutput
from kernelcore.executor.rejection_sampler import verify
from kernelcore.executor.sampler import Sampler, SamplingMetadata, build_metadata, compute_logprobs

logger = logging.getLogger("kernelcore.worker")


@functools.cache
def _entry_cls() -> type:
    try:
        from kernelcore.executor.model_runner import SeqBatchEntry
    except ImportError:  # a runner-less worker (tests with a fake runner)
        @dataclass
        class SeqBatchEntry:  # type: ignore[no-redef]  # the same fields, for when the import fails
            token_ids: list[int]
            num_computed_tokens: int
            block_table: list[int]
            num_logits: int = 1
            lora_id: int = 0
    return SeqBatchEntry


class CachedRequestState:
    __slots__ = ("req_id", "token_ids", "num_prompt_tokens", "params", "block_ids", "num_computed_tokens",
                 "lora_id", "generator", "num_prompt_logprobs_done", "min_tokens_ids")

    def __init__(self, req_id: str, token_ids: list[int], params: SamplingParams, block_ids: list[int],
                 num_computed_tokens: int, lora_id: int, eos_token_id: int | None = None,
                 num_prompt_tokens: int = -1) -> None:
        self.req_id, self.token_ids, self.params = req_id, token_ids, params
        self.num_prompt_tokens = len(token_ids) if num_prompt_tokens < 0 else num_prompt_tokens
        self.block_ids, self.num_computed_tokens, self.lora_id = block_ids, num_computed_tokens, lora_id
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        eos = [eos_token_id] if eos_token_id is not None and not params.ignore_eos else []
        self.min_tokens_ids = list(params.stop_token_ids or ()) + eos  # forbidden until min_tokens are out
        self.num_prompt_logprobs_done = 1 if params.prompt_logprobs is not None else self.num_prompt_tokens

    def seed_generator(self) -> None:
        """Seeded draws are a function of (seed, output position), not of the draws before: a request carried to
        another replica with its tokens continues exactly as it would have (and a row's draws never depend on
        how earlier steps were split)."""
        seed = self.params.seed
        if self.generator is not None and seed is not None:
            position = len(self.token_ids) - self.num_prompt_tokens
            self.generator.manual_seed((seed + position * 0x9E3779B97F4A7C15) % (1 << 64))


class WorkerBase:
    def __init__(self, config: KernelConfig, rank: int = 0, distributed_init_method: str | None = None) -> None:
        self.config = config
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.is_driver = rank == config.parallel.driver_rank  # the last pipeline stage samples
        self.requests: dict[str, CachedRequestState] = {}
        self.sampler = Sampler()
        self.model_runner: Any = None  # a ModelRunner once load_model ran
        self._metadata_key: tuple[str, ...] | None = None
        self._metadata: SamplingMetadata | None = None
        # (rows, bitmask) of this step's constrained rows
        self._grammar: tuple[torch.Tensor, torch.Tensor] | None = None

    def init_device(self) -> None:
        torch.manual_seed(self.config.model.seed)

    def load_model(self) -> None:
        from kernelcore.executor.model_runner import ModelRunner

        self.model_runner = ModelRunner(self.config)
        self.model_runner.load_model()

    @property
    def vocab_size(self) -> int:
        return self.model_runner.vocab_size

    def determine_num_blocks(self) -> int:
        """As many blocks as ``cache.kv_cache_memory`` holds, capped at what max_num_seqs full-length sequences need."""
        cache = self.config.cache
        num_blocks = cache.kv_cache_memory // self.model_runner.kv_cache_bytes_per_block()
        max_model_len = self.config.model.max_model_len
        assert max_model_len is not None  # build_config fills it
        max_blocks_per_seq = -(-max_model_len // cache.block_size)
        num_blocks = min(num_blocks, self.config.scheduler.max_num_seqs * max_blocks_per_seq)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory={cache.kv_cache_memory} bytes holds no KV block "
                             f"({self.model_runner.kv_cache_bytes_per_block()} bytes each); raise kv_cache_memory")
        return int(num_blocks)

    def initialize_cache(self, num_blocks: int) -> None:
        self.config.cache.num_blocks = num_blocks
        self.model_runner.allocate_kv_cache(num_blocks)

    def add_lora(self, lora_id: int, path: str) -> None:
        """Register an adapter directory; each rank reads it from disk when a step first needs it."""
        if self.model_runner.lora_manager is None:
            raise RuntimeError("LoRA is not enabled (enable_lora=False)")
        self.model_runner.lora_manager.add_lora(lora_id, path)

    def remove_lora(self, lora_id: int) -> None:
        if self.model_runner.lora_manager is not None:
            self.model_runner.lora_manager.remove_lora(lora_id)

    # -- one step ------------------------------------------------------------------------------------------

    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in so.new_reqs:
            self.requests[new.req_id] = CachedRequestState(new.req_id, list(new.prompt_token_ids), new.sampling_params,
                                                           list(new.block_ids), new.num_computed_tokens, new.lora_id,
                                                           new.eos_token_id, new.num_prompt_tokens)
        for cached in so.cached_reqs:
            state = self.requests[cached.req_id]
            state.token_ids.extend(cached.new_token_ids)
            if cached.is_resumed:
                state.block_ids = list(cached.new_block_ids)
            else:
                state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        SeqBatchEntry = _entry_cls()
        self._update_states(so)
        if not so.num_scheduled_tokens:
            return ModelRunnerOutput([], [])
        failed_loras = self._prepare_loras(so)
        entries, sample_states, prompt_lp, sample_drafts = [], [], [], []
        sample_rows: list[int] = []
        num_rows = 0
        for req_id, num_tokens in so.num_scheduled_tokens.items():
            state = self.requests[req_id]
            if state.lora_id in failed_loras:  # fails alone: the scheduler finishes it with the reason
                del self.requests[req_id]
                continue
            drafts = so.draft_token_ids.get(req_id) if so.draft_token_ids else None
            start, end = state.num_computed_tokens, state.num_computed_tokens + num_tokens
            is_final = end >= len(state.token_ids)
            needs_prompt_lp = state.num_prompt_logprobs_done < state.num_prompt_tokens
            num_logits = num_tokens if needs_prompt_lp else int(is_final)
            if drafts:
                # The last real token, then the drafts, each as a one-token step of its own at its position over
                # the same block table: attention reads what the earlier ones wrote in the same layer (causal),
                # and the whole verification runs the decode path (decode kernels, captured graphs), so each row
                # computes what plain decoding computes at that position.
                num_logits = len(drafts) + 1
                for i, token_id in enumerate(state.token_ids[start:end] + drafts):
                    entries.append(SeqBatchEntry([token_id], start + i, state.block_ids, 1, state.lora_id))
            else:
                entries.append(SeqBatchEntry(state.token_ids[start:end], start, state.block_ids, num_logits,
                                             state.lora_id))
            if needs_prompt_lp:
                prompt_lp.append((state, num_rows, start, end))
            num_rows += num_logits
            if is_final:
                sample_states.append(state)
                sample_drafts.append(drafts or [])
                sample_rows.extend(range(num_rows - 1 - len(drafts or ()), num_rows))
            state.num_computed_tokens = end
        if not entries:
            return ModelRunnerOutput([], [], failed_loras=failed_loras) if self.is_driver else None
        logits = self.model_runner.execute(entries)
        if not self.is_driver:
            return None
        output = ModelRunnerOutput([s.req_id for s in sample_states], [], failed_loras=failed_loras)
        for state, row, start, end in prompt_lp:
            output.prompt_logprobs[state.req_id] = self._prompt_logprobs(state, logits[row:row + end - start], start,
                                                                         end)
        if sample_states:
            self._grammar = None
            if so.grammar_req_ids:
                row_of, row = {}, 0
                for state, drafts in zip(sample_states, sample_drafts, strict=True):
                    row_of[state.req_id] = row
                    row += 1 + len(drafts)
                rows, seen = [], collections.Counter[str]()
                for r in so.grammar_req_ids:  # a request with drafts has consecutive rows
                    rows.append(row_of[r] + seen[r])
                    seen[r] += 1
                bitmask = torch.frombuffer(bytearray(so.grammar_bitmask), dtype=torch.int32)
                self._grammar = (torch.tensor(rows), bitmask.view(len(so.grammar_req_ids), -1))
            sample_logits = logits[sample_rows] if num_rows != len(sample_rows) else logits
            if any(sample_drafts):
                self._verify(sample_logits, sample_states, sample_drafts, output)
            else:
                self._sample(sample_logits, sample_states, output)
        return output

    def _prepare_loras(self, so: SchedulerOutput) -> dict[int, str]:
        """Load this step's adapters before the forward; those that cannot be used -> reason."""
        manager = getattr(self.model_runner, "lora_manager", None)
        lora_ids = [self.requests[req_id].lora_id for req_id in so.num_scheduled_tokens]
        if manager is None or not any(lora_ids):
            return {}
        return manager.prepare_step(lora_ids)

    def _sampling_metadata(self, states: list[CachedRequestState]):
        key = tuple(s.req_id for s in states)
        if key != self._metadata_key:
            self._metadata_key = key
            self._metadata = build_metadata([s.params for s in states], [s.generator for s in states], self.vocab_size)
        md = self._metadata
        assert md is not None  # built above on the first call (the key starts as None)
        md.grammar_rows, md.grammar_bitmask = self._grammar or (None, None)
        if md.has_min_tokens:
            md.min_tokens_masks = [(row, s.min_tokens_ids) for row, s in enumerate(states)
                                   if s.min_tokens_ids and len(s.token_ids) - s.num_prompt_tokens < s.params.min_tokens]
        if md.has_penalties:
            md.prompt_token_ids = [s.token_ids[:s.num_prompt_tokens] for s in states]
            md.output_token_ids = [s.token_ids[s.num_prompt_tokens:] for s in states]
        return md

    def _sample(self, logits: torch.Tensor, states: list[CachedRequestState], output: ModelRunnerOutput) -> None:
        md = self._sampling_metadata(states)
        for state in states:
            state.seed_generator()
        result = self.sampler(logits, md)
        output.sampled_token_ids = result.sampled_token_ids.tolist()
        if result.logprobs is not None:
            assert result.logprob_token_ids is not None and result.ranks is not None  # set with logprobs
            ids, lps, ranks = result.logprob_token_ids.tolist(), result.logprobs.tolist(), result.ranks.tolist()
            for row, s in enumerate(states):
                if s.params.logprobs is not None:
                    k = 1 + s.params.logprobs
                    output.logprobs[s.req_id] = TokenLogprobs(ids[row][:k], lps[row][:k], ranks[row])

    def _verify(self, logits: torch.Tensor, states: list[CachedRequestState], drafts: list[list[int]],
                output: ModelRunnerOutput) -> None:
        """Speculative decoding: rows 1 + len(drafts) per request; keep the drafts plain sampling agrees with."""
        params: list[SamplingParams] = []
        generators: list[torch.Generator | None] = []
        min_masks: list[tuple[int, list[int]]] = []
        prompts: list[list[int]] = []
        outputs: list[list[int]] = []
        for state, d in zip(states, drafts, strict=True):
            state.seed_generator()
            num_output = len(state.token_ids) - state.num_prompt_tokens
            for j in range(len(d) + 1):  # row j samples after j drafts
                row = len(params)
                params.append(state.params)
                generators.append(state.generator)
                if state.min_tokens_ids and num_output + j < state.params.min_tokens:
                    min_masks.append((row, state.min_tokens_ids))
                prompts.append(state.token_ids[:state.num_prompt_tokens])
                outputs.append(state.token_ids[state.num_prompt_tokens:] + d[:j])
        md = build_metadata(params, generators, self.vocab_size)
        md.grammar_rows, md.grammar_bitmask = self._grammar or (None, None)
        md.min_tokens_masks = min_masks
        if md.has_penalties:
            md.prompt_token_ids, md.output_token_ids = prompts, outputs
        self._metadata_key = None  # the plain path's cached metadata no longer matches its rows
        result = verify(logits, md, drafts, [s.generator for s in states])
        output.sampled_token_ids = result.next_token_ids
        for state, kept in zip(states, result.accepted, strict=True):
            if kept:
                output.accepted_draft_ids[state.req_id] = kept
        num_logprobs = md.max_num_logprobs
        if num_logprobs is None:
            return
        used = (result.row_token_ids >= 0).nonzero().squeeze(1)
        ids, lps, ranks = compute_logprobs(result.raw_logits[used], result.row_token_ids[used], num_logprobs)
        ids, lps, ranks = ids.tolist(), lps.tolist(), ranks.tolist()
        i = 0
        for state, kept in zip(states, result.accepted, strict=True):
            rows = [TokenLogprobs(ids[i + j][:1 + state.params.logprobs], lps[i + j][:1 + state.params.logprobs],
                                  ranks[i + j]) for j in range(len(kept) + 1)] if state.params.logprobs is not None \
                else []
            i += len(kept) + 1
            if rows:
                output.logprobs[state.req_id] = rows[-1]
                if kept:
                    output.accepted_draft_logprobs[state.req_id] = rows[:-1]

    def _prompt_logprobs(self, state: CachedRequestState, logits: torch.Tensor, start: int,
                         end: int) -> list[TokenLogprobs]:
        # Logits at position p predict token p + 1; only prompt tokens not reported yet are returned.
        first = max(state.num_prompt_logprobs_done, start + 1)
        last = min(end + 1, state.num_prompt_tokens)
        if first >= last:
            return []
        targets = torch.tensor(state.token_ids[first:last])
        rows = logits[first - 1 - start:last - 1 - start]
        num_logprobs = state.params.prompt_logprobs
        assert num_logprobs is not None  # otherwise num_prompt_logprobs_done starts at the prompt's end
        ids, lps, ranks = compute_logprobs(rows, targets, num_logprobs)
        state.num_prompt_logprobs_done = last
        return [TokenLogprobs(i, lp, r) for i, lp, r in zip(ids.tolist(), lps.tolist(), ranks.tolist(), strict=True)]
