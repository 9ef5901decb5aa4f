"""Plain-data configs that pickle across spawn; per-rank copies via dataclasses.replace."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    model: str | None = None  # local HF directory; None = the embedded default model
    dtype: str = "auto"  # "auto" (the platform's choice; float32 if it makes none) | "float32" | "bfloat16" | "float16"
    quantization: str | None = None  # a quantization-method name ("int8", ...); None = unquantized
    max_model_len: int | None = None  # None = from the HF config
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False  # serve token-id prompts only: no tokenizer is loaded, outputs carry no text
    chat_template: str | None = None
    served_model_name: str | None = None
    architecture: str | None = None  # resolved by build_config
    enforce_eager: bool = False  # never capture decode graphs, even where the platform can
    graph_capture_sizes: list[int] | None = None  # decode batch sizes to capture; None = 1, 2, 4, 8, 16, ...


@dataclass
class CacheConfig:
    block_size: int = 16
    kv_cache_memory: int = 2 << 30  # bytes for the whole KV cache (per rank)
    # the cache's element type: "auto" = the model's dtype, or one its attention backend lists in
    # supported_kv_cache_dtypes ("bfloat16" under a float32 model halves the cache)
    kv_cache_dtype: str = "auto"
    num_blocks: int | None = None  # set by the worker after profiling
    enable_prefix_caching: bool = True
    sliding_window: int | None = None  # from the model: no layer looks further back (older KV blocks are freed)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1  # stages of tensor_parallel_size ranks each, layers split across them
    rank: int = 0
    worker_cls: str = "auto"
    num_threads: int | None = None  # torch threads per worker; None = the CPU cores divided among the ranks
    distributed_init_method: str | None = None
    data_parallel_size: int = 1  # engine cores behind one front end, each with its own TP x PP workers
    data_parallel_rank: int = 0
    # Data parallelism across hosts: this host runs DP ranks start..start+local-1; the head (start 0) serves the API
    # and accepts the other hosts' replicas (``--headless``) on data_parallel_address:data_parallel_rpc_port.
    data_parallel_size_local: int | None = None  # None: every replica on this host
    data_parallel_start_rank: int = 0
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int | None = None
    distributed_executor_backend: str | None = None  # a registered executor name; None = "uni" or "mp" by size
    # Several hosts (the multiprocess executor): node 0 runs the engine, the others run workers only (headless).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None  # the head's address every node reaches; the head binds it (only it)
    master_port: int | None = None
    cluster_secret: str | None = field(default=None, repr=False)  # authenticates every cross-host connection

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def driver_rank(self) -> int:
        """The rank that samples and returns the step's output: the last stage's first."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def data_parallel_local_ranks(self) -> range:
        """The data-parallel ranks whose engine cores run on this host."""
        local = self.data_parallel_size if self.data_parallel_size_local is None else self.data_parallel_size_local
        return range(self.data_parallel_start_rank, self.data_parallel_start_rank + local)

    def node_ranks(self, node_rank: int) -> range:
        """The global ranks whose workers run on node ``node_rank``."""
        return range(node_rank * self.ranks_per_node, (node_rank + 1) * self.ranks_per_node)


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048


@dataclass
class LoraConfig:
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    max_cpu_loras: int = 8


@dataclass
class DecodingConfig:
    structured_outputs_backend: str = "auto"  # "auto" or a registered grammar-backend name
    structured_outputs_compact_whitespace: bool = False  # constrained JSON without whitespace between tokens


@dataclass
class SpeculativeConfig:
    """Speculative decoding: a proposer guesses the next tokens, one forward verifies them (off when method is None)."""

    method: str | None = None  # a registered proposer ("ngram", or a plugin's)
    num_speculative_tokens: int = 0  # draft tokens per step (at most)
    prompt_lookup_max: int = 4  # n-gram proposer: longest suffix looked up in the context
    prompt_lookup_min: int = 2  # n-gram proposer: shortest
    # Back-off: a request whose recent acceptance rate falls below this stops proposing for a while (doubling)
    min_acceptance_rate: float = 0.2
    options: dict[str, Any] = field(default_factory=dict)  # further keys, for a plugin's proposer

    @property
    def enabled(self) -> bool:
        return self.method is not None and self.num_speculative_tokens > 0


@dataclass
class KernelConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    custom_ops: list[str] = field(default_factory=list)  # "all"/"none" + "+name"/"-name"
    device_type: str = "cpu"
    platform_plugin: str | None = None  # entry-point name of the resolved platform
    plugin_options: dict[str, Any] = field(default_factory=dict)  # CLI options plugins added (pre_register_and_update)
    user_set: frozenset[str] = frozenset()  # "section.field" names the user gave explicitly ("model.dtype")

    def is_user_set(self, name: str) -> bool:
        """Whether the user chose ``name`` (e.g. ``"cache.block_size"``): a platform defaults only the others."""
        return name in self.user_set

    def for_rank(self, rank: int) -> KernelConfig:
        return dataclasses.replace(self, parallel=dataclasses.replace(self.parallel, rank=rank))


def validate_custom_ops(custom_ops: list[str]) -> None:
    base = [s for s in custom_ops if s in ("all", "none")]
    if len(base) != 1:
        raise ValueError(f"custom_ops must contain exactly one base mode: 'all' or 'none' (got {custom_ops})")
    for s in custom_ops:
        if s in ("all", "none"):
            continue
        if s[:1] not in "+-" or len(s) < 2:
            raise ValueError(f"custom_ops entry {s!r} must be 'all', 'none', '+name' or '-name'")
        if ("+" + s[1:]) in custom_ops and ("-" + s[1:]) in custom_ops:
            raise ValueError(f"custom op {s[1:]!r} is both enabled and disabled in {custom_ops}")


_current: KernelConfig | None = None


def get_current_config() -> KernelConfig:
    """The config of the model being built in this process (a default one if none)."""
    global _current
    if _current is None:
        _current = KernelConfig(custom_ops=["all"])
    return _current


@contextlib.contextmanager
def set_current_config(config: KernelConfig) -> Iterator[KernelConfig]:
    global _current
    previous, _current = _current, config
    try:
        yield config
    finally:
        _current = previous
