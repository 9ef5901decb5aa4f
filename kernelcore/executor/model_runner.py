"""The model runner: builds the model, owns the paged KV cache, runs one flattened batch per step."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch

from kernelcore.attention.metadata import AttentionMetadata
from kernelcore.config_builder import load_hf_config
from kernelcore.contract.config import KernelConfig
from kernelcore.executor.graph_runner import DecodeGraphRunner, capture_sizes, graph_capture_backend, verification_rows
from kernelcore.forward_context import set_forward_context
from kernelcore.layers.attention import Attention
from kernelcore.models.loader import get_dtype, get_model
from kernelcore.pipeline import get_pp_group

if TYPE_CHECKING:
    from kernelcore.lora.manager import LoRAModelManager


@dataclass
class SeqBatchEntry:
    token_ids: list[int]  # tokens to compute this step (a prefill chunk, or the 1 decode token)
    num_computed_tokens: int  # tokens of this sequence already in the KV cache = position of token_ids[0]
    block_table: list[int]  # the sequence's KV block ids, covering num_computed_tokens + len(token_ids)
    num_logits: int = 1  # trailing positions needing logits: 0, 1, or len(token_ids) (prompt logprobs)
    lora_id: int = 0  # engine LoRA id (0 = the base model)


class ModelRunner:
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.hf_config = load_hf_config(config.model)
        self.vocab_size: int = self.hf_config.vocab_size
        self.dtype = get_dtype(config.model.dtype)
        self.block_size = config.cache.block_size
        self.model: Any = None  # the nn.Module get_model builds (duck-typed: compute_logits), once load_model ran
        self.lora_manager: LoRAModelManager | None = None
        self.attn_layers: list[Attention] = []
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self._arange = torch.arange(max(config.scheduler.max_num_batched_tokens, config.model.max_model_len or 0) + 1)
        self.graph_runner: DecodeGraphRunner | None = None  # decode graphs, when the platform captures them

    def load_model(self, is_dummy: bool = False) -> None:
        self.model = get_model(self.config, is_dummy=is_dummy)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        if self.config.lora.enable_lora:
            from kernelcore.lora.manager import LoRAModelManager

            self.lora_manager = LoRAModelManager(self.model, self.config)

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The KV cache's element type: the model's, or ``cache.kv_cache_dtype`` where every attention layer's
        backend lists it (else a ValueError at start-up, naming the backend)."""
        name = self.config.cache.kv_cache_dtype
        if name == "auto":
            return self.dtype
        for layer in self.attn_layers:
            backend = layer.backend
            if get_dtype(name) != self.dtype and name not in getattr(backend, "supported_kv_cache_dtypes", ()):
                raise ValueError(f"kv_cache_dtype={name!r}: the attention backend {backend.get_name()} keeps its "
                                 f"cache in the model's dtype ({self.config.model.dtype}) or "
                                 f"{', '.join(getattr(backend, 'supported_kv_cache_dtypes', ())) or 'nothing else'}")
        return get_dtype(name)

    def kv_cache_bytes_per_block(self) -> int:
        element_size = torch.empty((), dtype=self.kv_cache_dtype).element_size()
        return sum(2 * self.block_size * a.num_kv_heads * a.head_size * element_size for a in self.attn_layers)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        graph_backend = graph_capture_backend(self.config)
        self.kv_caches = []
        for layer in self.attn_layers:
            # With graphs, one spare block past the scheduler's: padded decode rows write their K/V there.
            shape = layer.backend.get_kv_cache_shape(num_blocks + (graph_backend is not None), self.block_size,
                                                     layer.num_kv_heads, layer.head_size)
            layer.kv_cache = self.new_kv_cache(shape, self.kv_cache_dtype)
            self.kv_caches.append(layer.kv_cache)
        self.num_blocks = num_blocks
        if graph_backend is not None:
            self.capture_graphs(graph_backend)

    def new_kv_cache(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """One attention layer's KV cache of ``shape`` (the backend's ``get_kv_cache_shape``), zeroed. A platform's
        runner may allocate it its own way (the CPU platform's maps zero pages that use memory once written)."""
        return torch.zeros(shape, dtype=dtype)

    def capture_graphs(self, backend) -> None:
        """Capture the decode forward for each size of ``capture_sizes`` (the KV cache is allocated)."""
        max_len = self.config.model.max_model_len
        assert max_len is not None  # build_config fills it
        limit = backend.max_capture_size
        if limit:  # (0: this backend captures nothing, speculative or not)
            limit = max(limit, verification_rows(self.config))
        sizes = [s for s in capture_sizes(self.config) if limit is None or s <= limit]
        if not sizes:
            return
        self.graph_runner = DecodeGraphRunner(
            self.model, backend, sizes, max_blocks_per_seq=-(-max_len // self.block_size),
            pad_block=self.num_blocks, block_size=self.block_size, max_seq_len=max_len,
            device=next(self.model.parameters()).device)
        if not self.graph_runner.capture():
            self.graph_runner = None

    def _arange_to(self, n: int) -> torch.Tensor:
        if n >= self._arange.numel():
            self._arange = torch.arange(2 * n)
        return self._arange[:n]

    def prepare(self, entries: list[SeqBatchEntry]):
        """input_ids, positions, attention metadata and logits row indices for a flattened batch."""
        if all(len(e.token_ids) == 1 and e.num_logits == 1 and not e.lora_id for e in entries):
            return self._prepare_decode(entries)
        return self._prepare_any(entries)

    def _prepare_any(self, entries: list[SeqBatchEntry]):
        block_size = self.block_size
        query_lens = [len(e.token_ids) for e in entries]
        context_lens = [e.num_computed_tokens for e in entries]
        seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
        num_seqs, num_tokens = len(entries), sum(query_lens)
        input_ids = torch.tensor(list(chain.from_iterable(e.token_ids for e in entries)), dtype=torch.long)
        query_lens_t = torch.tensor(query_lens)
        context_lens_t = torch.tensor(context_lens)
        query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.long)
        torch.cumsum(query_lens_t, 0, out=query_start_loc[1:])
        # Per token: its sequence, then its position = context + offset within the chunk.
        seq_idx = torch.repeat_interleave(self._arange_to(num_seqs), query_lens_t, output_size=num_tokens)
        positions = self._arange_to(num_tokens) - query_start_loc[seq_idx] + context_lens_t[seq_idx]
        num_blocks = [-(-s // block_size) for s in seq_lens]
        max_blocks = max(num_blocks)
        block_tables = torch.tensor([e.block_table[:n] + [0] * (max_blocks - n)
                                     for e, n in zip(entries, num_blocks, strict=True)], dtype=torch.long)
        slot_mapping = block_tables[seq_idx, positions // block_size] * block_size + positions % block_size
        metadata = AttentionMetadata(
            slot_mapping=slot_mapping, query_start_loc=query_start_loc, seq_lens=torch.tensor(seq_lens),
            context_lens=context_lens_t, block_tables=block_tables, query_lens_list=query_lens,
            seq_lens_list=seq_lens, max_query_len=max(query_lens), max_seq_len=max(seq_lens))
        # Logits rows: the last num_logits tokens of each sequence.
        num_logits = torch.tensor([e.num_logits for e in entries])
        total_logits = int(num_logits.sum())
        logits_start = torch.zeros(num_seqs, dtype=torch.long)
        torch.cumsum(num_logits[:-1], 0, out=logits_start[1:])
        row_seq = torch.repeat_interleave(self._arange_to(num_seqs), num_logits, output_size=total_logits)
        logits_idx = (query_start_loc[1:][row_seq] - num_logits[row_seq]
                      + (self._arange_to(total_logits) - logits_start[row_seq]))
        lora_ids = None
        if any(e.lora_id for e in entries):
            assert self.lora_manager is not None  # adapters are only added to a runner with LoRA enabled
            lora_ids = torch.tensor(self.lora_manager.activate([e.lora_id for e in entries]))[seq_idx]
        return input_ids, positions, metadata, logits_idx, lora_ids

    def _prepare_decode(self, entries: list[SeqBatchEntry]):
        """prepare() for a step of decode tokens only (one token and one logit row each, no adapter), built
        from plain lists: the per-token index arithmetic of the general case is a dozen small torch ops per
        step, a noticeable share of a batch-1 step on a CPU."""
        block_size = self.block_size
        context_lens = [e.num_computed_tokens for e in entries]  # the new token's position
        seq_lens = [c + 1 for c in context_lens]
        num_blocks = [-(-s // block_size) for s in seq_lens]
        max_blocks = max(num_blocks)
        tables = [e.block_table[:n] + [0] * (max_blocks - n) for e, n in zip(entries, num_blocks, strict=True)]
        slots = [t[c // block_size] * block_size + c % block_size for t, c in zip(tables, context_lens, strict=True)]
        context_lens_t = torch.tensor(context_lens, dtype=torch.long)
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long), query_start_loc=torch.arange(len(entries) + 1),
            seq_lens=torch.tensor(seq_lens, dtype=torch.long), context_lens=context_lens_t,
            block_tables=torch.tensor(tables, dtype=torch.long), query_lens_list=[1] * len(entries),
            seq_lens_list=seq_lens, max_query_len=1, max_seq_len=max(seq_lens))
        input_ids = torch.tensor([e.token_ids[0] for e in entries], dtype=torch.long)
        return input_ids, context_lens_t, metadata, torch.arange(len(entries)), None

    @torch.inference_mode()
    def execute(self, entries: list[SeqBatchEntry]) -> torch.Tensor | None:
        """Float32 logits [sum(num_logits), vocab], rows in entry order (None on a stage before the last)."""
        input_ids, positions, metadata, logits_idx, lora_ids = self.prepare(entries)
        pp = get_pp_group()
        graph_runner = self.graph_runner if pp.num_stages == 1 else None
        graph_size = graph_runner.accepts(metadata, logits_idx, lora_ids) if graph_runner is not None else None
        if graph_runner is not None and graph_size is not None:
            logits = graph_runner.run(graph_size, input_ids, positions, metadata)
        else:
            with set_forward_context(metadata, lora_ids):
                if pp.num_stages > 1:
                    intermediate = None if pp.is_first else pp.recv(self.dtype, input_ids.device)
                    hidden = self.model(input_ids, positions, intermediate)
                    if not pp.is_last:
                        pp.send(hidden)
                        return None
                else:
                    hidden = self.model(input_ids, positions)
                if logits_idx.numel() == 0:
                    return torch.empty(0, self.vocab_size, dtype=torch.float32)
                logits = self.model.compute_logits(hidden[logits_idx])
        return self.logits_to_float32(logits)

    def logits_to_float32(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits (any dtype, maybe a padded vocabulary) as float32 [rows, vocab]; a platform's
        runner may override it (the CPU one reuses a buffer)."""
        return logits[:, : self.vocab_size].float()
