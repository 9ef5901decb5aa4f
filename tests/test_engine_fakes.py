"""A fake model runner for engine tests: it stores token ids as its "KV cache" and computes logits from the
context it reads back through the block table, so a wrong block table or prefix-cache hit changes the output."""

from __future__ import annotations

import torch

from kernelcore.config import CacheConfig, KernelConfig, ModelConfig, SchedulerConfig
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.executor.uniproc import UniProcExecutor
from kernelcore.executor.worker import WorkerBase

VOCAB = 64


def fake_logits(context: list[int]) -> torch.Tensor:
    seed = hash(tuple(context)) % (2**31)
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3.0


class FakeRunner:
    vocab_size = VOCAB

    def __init__(self, config: KernelConfig) -> None:
        self.block_size = config.cache.block_size
        self.num_forwards = 0
        self.num_computed = 0

    def load_model(self) -> None:
        pass

    def kv_cache_bytes_per_block(self) -> int:
        return self.block_size * 8

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv = torch.full((num_blocks, self.block_size), -1, dtype=torch.long)

    def execute(self, entries) -> torch.Tensor:
        self.num_forwards += 1
        bs, rows = self.block_size, []
        for e in entries:
            assert len(e.block_table) * bs >= e.num_computed_tokens + len(e.token_ids)
            for j, t in enumerate(e.token_ids):
                pos = e.num_computed_tokens + j
                self.kv[e.block_table[pos // bs], pos % bs] = t
            self.num_computed += len(e.token_ids)
            for j in range(len(e.token_ids) - e.num_logits, len(e.token_ids)):
                pos = e.num_computed_tokens + j
                context = [int(self.kv[e.block_table[p // bs], p % bs]) for p in range(pos + 1)]
                assert min(context) >= 0
                rows.append(fake_logits(context))
        return torch.stack(rows) if rows else torch.empty(0, VOCAB)


class FakeWorker(WorkerBase):
    def load_model(self) -> None:
        self.model_runner = FakeRunner(self.config)


class FakeExecutor(UniProcExecutor):
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.worker = FakeWorker(config)
        self.worker.init_device()
        self.worker.load_model()


def make_config(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 256, max_num_seqs: int = 16,
                max_num_batched_tokens: int = 64, enable_prefix_caching: bool = True) -> KernelConfig:
    return KernelConfig(model=ModelConfig(model="fake", max_model_len=max_model_len),
                        cache=CacheConfig(block_size=block_size, kv_cache_memory=num_blocks * block_size * 8,
                                          enable_prefix_caching=enable_prefix_caching),
                        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                                  max_num_batched_tokens=max_num_batched_tokens),
                        custom_ops=["all"])


def make_core(**kwargs) -> EngineCore:
    return EngineCore(make_config(**kwargs), executor_cls=FakeExecutor)


def make_request(request_id: str, prompt: list[int], eos_token_id: int | None = None, **params) -> EngineCoreRequest:
    params.setdefault("temperature", 0.0)
    return EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt, sampling_params=SamplingParams(**params),
                             eos_token_id=eos_token_id)


def run_to_completion(core: EngineCore, max_steps: int = 10_000) -> dict[str, list]:
    """request id -> [token ids, finish_reason, stop_reason]"""
    results: dict[str, list] = {}
    for _ in range(max_steps):
        if not core.has_unfinished_requests():
            return results
        for out in core.step().outputs:
            entry = results.setdefault(out.request_id, [[], None, None])
            entry[0].extend(out.new_token_ids)
            if out.finish_reason:
                entry[1], entry[2] = out.finish_reason, out.stop_reason
    raise AssertionError("engine did not finish")


def reference_greedy(prompt: list[int], num_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(int(fake_logits(tokens).argmax()))
    return tokens[len(prompt):]
