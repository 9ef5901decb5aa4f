"""Decode graphs: the decode forward recorded once per batch size, replayed on static buffers.

A platform opts in through the ``get_graph_capture_backend_cls`` hook, naming a :class:`GraphCaptureBackend`
(the CUDA platform: CUDA graphs). After the KV cache is allocated the model runner captures the forward of
an all-decode batch for each size in :func:`capture_sizes`, largest first. A decode step of ``n``
sequences then copies its inputs and attention metadata into the first ``n`` rows of the static buffers,
pads the rest up to the nearest captured size and replays; prefill or mixed steps, LoRA batches and larger
batches run eagerly.

Padded rows are harmless: each writes its key and value into a slot of a spare KV block the scheduler never
hands out, and attends to one key. A graph freezes every host value, so the metadata's host fields hold
upper bounds (``max_seq_len`` = the model's context length) and attention backends read the per-step lengths
from the device tensors alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import torch

from kernelcore.attention.metadata import AttentionMetadata
from kernelcore.forward_context import set_forward_context

logger = logging.getLogger("kernelcore.graphs")

DEFAULT_MAX_CAPTURE_SIZE = 256


class CapturedGraph(Protocol):
    def replay(self) -> torch.Tensor:
        """Run the recorded work again; returns the output tensor the capture produced, rewritten."""


class GraphCaptureBackend:
    """How a platform records a callable's device work and replays it. One instance per worker."""

    name = "graphs"
    # The largest batch this backend captures (None: every size of capture_sizes); a backend whose graphs
    # cannot share memory keeps to the sizes where replaying pays. A speculative verification's sizes (up to
    # num_speculative_tokens + 1 rows) are captured past it (unless it is 0: nothing is captured): one
    # sequence's step, where replaying pays most.
    max_capture_size: int | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> CapturedGraph:
        """Record ``fn`` (which reads and writes only tensors that outlive it) and return its replayer."""
        raise NotImplementedError


def graph_capture_backend(config) -> GraphCaptureBackend | None:
    """The platform's capture backend, or None: ``enforce_eager``, or a platform that captures nothing."""
    if config.model.enforce_eager:
        return None
    from kernelcore import plugins
    from kernelcore.platforms import resolve_obj_by_qualname

    qualname = plugins.get_plugin_manager().hook.get_graph_capture_backend_cls(config=config)
    if not qualname:
        return None
    cls = resolve_obj_by_qualname(qualname)
    if not (isinstance(cls, type) and issubclass(cls, GraphCaptureBackend)):
        raise TypeError(f"get_graph_capture_backend_cls returned {qualname!r}, which is not a GraphCaptureBackend")
    return cls()


def verification_rows(config) -> int:
    """The decode rows of a lone request's speculative verification (num_speculative_tokens + 1; 0 without
    speculative decoding)."""
    if not config.speculative.enabled:
        return 0
    return min(config.speculative.num_speculative_tokens + 1, DEFAULT_MAX_CAPTURE_SIZE)


def capture_sizes(config) -> list[int]:
    """The batch sizes to capture, ascending: ``model.graph_capture_sizes``, else 1, 2, 4, then every 8th
    up to max_num_seqs (at most 256), max_num_seqs itself included; with speculative decoding also every size
    up to num_speculative_tokens + 1.

    A size counts decode rows: a verification of k drafts is k + 1 of them (one per position, see the
    worker), so a lone request's verification is 2 .. k + 1 rows; padded to the next size, 5 rows ran as 8
    and cost what 8 cost."""
    limit = config.scheduler.max_num_seqs
    sizes = config.model.graph_capture_sizes
    if sizes is None:
        top = min(limit, DEFAULT_MAX_CAPTURE_SIZE)
        sizes = [s for s in [1, 2, 4, *range(8, DEFAULT_MAX_CAPTURE_SIZE + 1, 8)] if s < top] + [top]
        verify_rows = verification_rows(config)
        sizes += range(1, verify_rows + 1)
        limit = max(limit, verify_rows)
    if any(s < 1 for s in sizes):
        raise ValueError(f"graph_capture_sizes must be positive (got {sizes})")
    return sorted({s for s in sizes if s <= limit})


class DecodeGraphRunner:
    """Static buffers for the largest captured batch, one captured graph per size."""

    def __init__(self, model, backend: GraphCaptureBackend, sizes: list[int], max_blocks_per_seq: int,
                 pad_block: int, block_size: int, max_seq_len: int, device: torch.device) -> None:
        self.model, self.backend, self.sizes = model, backend, sizes
        self.pad_slot = pad_block * block_size
        self.max_seq_len = max_seq_len
        size = sizes[-1]
        new = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=device)  # noqa: E731
        self.input_ids, self.positions = new(size), new(size)
        self.slot_mapping, self.seq_lens, self.context_lens = new(size), new(size), new(size)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.long, device=device)  # one token per sequence
        self.block_tables = new(size, max_blocks_per_seq)
        self.block_tables.fill_(pad_block)
        self._pad_rows(0, size)
        self.graphs: dict[int, CapturedGraph] = {}
        self.num_replays = 0

    def _pad_rows(self, start: int, end: int) -> None:
        self.slot_mapping[start:end] = self.pad_slot
        self.seq_lens[start:end] = 1
        self.context_lens[start:end] = 0

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size], context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size], query_lens_list=[1] * size,
            seq_lens_list=[self.max_seq_len] * size, max_query_len=1, max_seq_len=self.max_seq_len)

    def _forward(self, size: int) -> Callable[[], torch.Tensor]:
        metadata = self._metadata(size)

        def forward() -> torch.Tensor:
            metadata.scratch.clear()  # per-step values are recomputed by every replay
            with set_forward_context(metadata, None):
                hidden = self.model(self.input_ids[:size], self.positions[:size])
                return self.model.compute_logits(hidden)
        return forward

    @torch.inference_mode()
    def capture(self) -> bool:
        """Capture every size; False (and a warning) when the model cannot be captured: it then runs eagerly."""
        try:
            for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory
                self.graphs[size] = self.backend.capture(self._forward(size))
        except Exception as exc:  # e.g. a layer that reads device values on the host (a sync)
            logger.warning("Could not capture %s decode graphs (%s: %s); running every step eagerly "
                           "(--enforce-eager skips the attempt)", self.backend.name, type(exc).__name__, exc)
            self.graphs.clear()
            return False
        logger.info("Captured %s decode graphs for batch sizes %s", self.backend.name, self.sizes)
        return True

    def padded_size(self, num_seqs: int) -> int | None:
        """The smallest captured size holding ``num_seqs`` sequences, or None (run eagerly)."""
        for size in self.sizes:
            if size >= num_seqs:
                return size if size in self.graphs else None
        return None

    def accepts(self, metadata: AttentionMetadata, logits_idx: torch.Tensor, lora_ids) -> int | None:
        """The graph size for this batch, or None: not all-decode, a logit row missing, LoRA, or too large."""
        if lora_ids is not None or not metadata.is_all_decode or logits_idx.numel() != metadata.num_seqs:
            return None
        return self.padded_size(metadata.num_seqs)

    def run(self, size: int, input_ids: torch.Tensor, positions: torch.Tensor,
            metadata: AttentionMetadata) -> torch.Tensor:
        """Copy the step into the static buffers, replay the graph of ``size``; logits [num_seqs, vocab]."""
        n = metadata.num_seqs
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(metadata.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(metadata.seq_lens, non_blocking=True)
        self.context_lens[:n].copy_(metadata.context_lens, non_blocking=True)
        self.block_tables[:n, :metadata.block_tables.shape[1]].copy_(metadata.block_tables, non_blocking=True)
        if size > n:
            self._pad_rows(n, size)  # rows a previous, larger step left behind must not write its slots again
        self.num_replays += 1
        return self.graphs[size].replay()[:n]
