"""Which matmul serves each CPU linear layer at each batch size, measured at start-up on this machine.

The fastest way to multiply a few rows by a weight differs between CPUs by several times. On AVX2 the native
small-M kernel wins every decode batch; with AVX512-BF16 oneDNN's bf16 GEMM wins above 16 rows; with AMX
oneDNN wins bf16 at every size and torch's int8 matmul wins int8 at one row, where the native kernel is 2x
slower (docs/performance.md). Thresholds tuned on one machine were wrong on the next, so each distinct layer
shape is timed instead: every implementation its linear method offers (``candidates``), at row counts 1, 2,
4 ... 512, over the layers of that shape in turn (as a forward pass streams them from memory), fastest kept.
A call of R rows then takes the choice of the smallest measured count >= R (above 512, the 512-row choice).

All implementations compute the same product with float32 accumulation; they differ in rounding only. The
choices are kept in a JSON file per model shape, CPU (model and flags), thread count, torch version and native
kernel source, so a restart measures nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from builtin_plugins.cpu import gguf_native, small_gemm
from builtin_plugins.cpu.cpuinfo import cpu_id
from builtin_plugins.cpu.native import check_private, compile_flags, source_files

logger = logging.getLogger("kernelcore.cpu")

Impl = Callable[[nn.Module, torch.Tensor, "torch.Tensor | None"], "torch.Tensor | None"]
ROW_COUNTS = tuple(1 << i for i in range(10))  # 1 ... 512
SAMPLE_BYTES = 256 << 20  # at most this much of one shape's layers streamed per timing pass
MEMORY_BOUND_ROWS = 4  # up to this many rows a linear's time is its weight's bytes over the memory bandwidth
PASSES = 3  # timing passes per (rows, implementation); the fastest is kept (noise only ever adds time)
COMPUTE_BOUND_PASSES = 2  # compute-bound times vary less
LONG_CALL_S = 0.02  # once one call takes this long, larger counts keep the choice
DROP_RATIO = 3.0  # slower than the best by this much, and by more than at fewer rows: not timed at more rows


@dataclass(frozen=True)
class Candidates:
    """What a linear method can run one layer's matmul with. ``key``: layers with equal keys share a choice
    (method, weight shape, weight dtype); ``dtype``: the activations' dtype; ``impls``: name -> implementation,
    each ``impl(layer, x, bias)`` returning the output or None where it does not apply."""

    key: tuple
    dtype: torch.dtype
    impls: dict[str, Impl]
    in_features: int = 0  # the activations' width where the weight tensor's last dimension is not (packed blocks)
    # Calls of up to this many rows all take one implementation of ``row_exact`` (those computing each row the same
    # whatever the call's other rows), the one nearest the fastest over those counts: a row's result then does not
    # depend on how many rows its call has, so a speculative verification's rows equal plain decoding's and a
    # request's tokens do not change with the batch it shares. 0: a choice per count.
    same_upto: int = 0
    row_exact: tuple[str, ...] = ()


@dataclass(frozen=True)
class TunedLinear:
    """A layer's measured choice: ``names[i]`` (``impls[i]``) serves calls of up to ``ROW_COUNTS[i]`` rows."""

    dtype: torch.dtype
    names: tuple[str, ...]
    impls: tuple[Impl, ...]


def row_index(rows: int) -> int:
    return min(max(rows - 1, 0).bit_length(), len(ROW_COUNTS) - 1)


def run_tuned(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The layer's output through its measured choice, or None where it has none for x's dtype."""
    tuned: TunedLinear | None = layer.__dict__.get("_tuned_linear")
    if tuned is None or x.dtype != tuned.dtype or x.device.type != "cpu" or not x.shape[-1]:
        return None
    return tuned.impls[row_index(x.numel() // x.shape[-1])](layer, x, bias)


def tune_linears(model: nn.Module, max_rows: int = ROW_COUNTS[-1],
                 cache_dir: Path | None = None) -> dict[tuple, tuple[str, ...]]:
    """Measure and install a choice on every layer whose linear method offers ``candidates``; returns the
    choices by layer key. ``max_rows``: the largest call the model will see (no larger counts are timed).
    ``cache_dir``: where measured choices are kept and looked up (None: always measure)."""
    groups: dict[tuple, _Group] = {}
    for module in model.modules():
        offer = getattr(getattr(module, "quant_method", None), "candidates", None)
        if offer is None:
            continue
        candidates = offer(module)
        if candidates.impls:
            groups.setdefault(candidates.key, _Group(candidates)).layers.append(module)
    counts = sorted({n for n in ROW_COUNTS if n < max_rows} | {min(max(max_rows, 1), ROW_COUNTS[-1])})
    start = time.perf_counter()
    cache = cache_dir / f"{_identity(groups, counts)}.json" if cache_dir is not None and groups else None
    measured = _read(cache, groups) if cache is not None else None
    from_cache = measured is not None
    if measured is None:
        with torch.inference_mode():
            for rows in counts:
                begin = time.perf_counter()
                _time_at(list(groups.values()), rows)
                logger.debug("linear tuning: %d rows in %.3f s", rows, time.perf_counter() - begin)
        for group in groups.values():
            _one_choice_for_small_calls(group, counts)
        # Counts not timed (past max_rows, or every implementation refused) take the last measured choice.
        measured = {key: tuple(group.winners + [group.winners[-1]] * (len(ROW_COUNTS) - len(group.winners)))
                    for key, group in groups.items() if group.winners}
        if cache is not None:
            _write(cache, measured)
    choices = {}
    for key, names in measured.items():
        group = groups[key]
        impls = tuple(group.candidates.impls[name] for name in names)
        for layer in group.layers:
            layer.__dict__["_tuned_linear"] = TunedLinear(group.candidates.dtype, names, impls)
        choices[key] = names
    logger.info("CPU linears tuned in %.2f s%s: %s", time.perf_counter() - start,
                f" (from {cache})" if from_cache else "",
                "; ".join(f"{' '.join(map(str, key[1:]))}: {_summary(names)}" for key, names in choices.items()))
    return choices


class _Group:
    """The layers sharing one key, the implementations still in the running, and the winner per count."""

    def __init__(self, candidates: Candidates) -> None:
        self.candidates = candidates
        self.layers: list[nn.Module] = []
        self.alive = dict(candidates.impls)
        self.winners: list[str] = []
        self.times: list[dict[str, float]] = []  # per timed count: each implementation's best seconds
        self.ratios: dict[str, float] = {}  # each implementation's time over the winner's, at the last count
        self.done = False


def _time_at(groups: list[_Group], rows: int) -> None:
    """One count of rows for every group. Few rows are memory bound: each group streams all its layers, and
    the groups are timed in turn within a pass, so (as in a forward) the others' weights pass through the
    caches in between. Larger counts are compute bound and are timed on one layer."""
    generator = torch.Generator().manual_seed(rows)
    live: list[tuple[_Group, torch.Tensor, list[nn.Module], dict[str, float]]] = []
    for group in groups:
        if group.done:
            continue
        first = group.layers[0]
        width = group.candidates.in_features or _weight(first).shape[-1]
        x = torch.randn(rows, width, generator=generator).to(group.candidates.dtype)
        for name, impl in list(group.alive.items()):  # one warm-up call each; drop what does not apply
            try:
                if impl(first, x, _bias(first)) is None:
                    del group.alive[name]
            except (RuntimeError, ValueError):
                del group.alive[name]
        if not group.alive:
            group.done = True  # larger counts keep the last choice
            continue
        sample = _stream_sample(group.layers) if rows <= MEMORY_BOUND_ROWS else group.layers[:1]
        live.append((group, x, sample, {}))
    rounds = max((len(group.alive) for group, *_ in live), default=0)
    for _ in range(PASSES if rows <= MEMORY_BOUND_ROWS else COMPUTE_BOUND_PASSES):
        for turn in range(rounds):  # implementations interleaved, so a burst of machine load hits them alike
            for group, x, sample, best in live:
                names = list(group.alive)
                name = names[turn % len(names)]
                impl = group.alive[name]
                begin = time.perf_counter()
                for layer in sample:
                    impl(layer, x, _bias(layer))
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - begin)
    for group, _, sample, best in live:
        winner = min(best, key=best.__getitem__)
        logger.debug("linear %s at %d rows over %d layers: %s", group.candidates.key, rows, len(sample),
                     {name: f"{seconds * 1e3:.3f} ms" for name, seconds in best.items()})
        group.winners.append(winner)
        group.times.append(best)
        # Dropped: what is far behind and falling further behind as rows grow. An implementation with a fixed
        # cost per call (converting the weight) is far behind at one row and ahead at many.
        ratios = {name: best[name] / best[winner] for name in best}
        if rows > MEMORY_BOUND_ROWS:
            group.alive = {name: impl for name, impl in group.alive.items()
                           if ratios[name] <= DROP_RATIO or ratios[name] < group.ratios.get(name, float("inf"))}
        group.ratios = ratios
        # A call this long is compute bound at any larger count too: the ranking no longer moves, and timing
        # it again would cost seconds (a vocabulary-sized head at hundreds of rows).
        group.done = best[winner] / len(sample) > LONG_CALL_S


def _one_choice_for_small_calls(group: _Group, counts: list[int]) -> None:
    """Counts up to ``same_upto`` take the ``row_exact`` implementation whose time over the fastest's, summed over
    those counts, is least (among those timed at every one of them)."""
    upto = group.candidates.same_upto
    small = [i for i, rows in enumerate(counts[:len(group.times)]) if rows <= upto]
    if len(small) < 2:
        return
    names = set.intersection(*(set(group.times[i]) for i in small)) & set(group.candidates.row_exact)
    if not names:
        return
    cost = {name: sum(group.times[i][name] / min(group.times[i].values()) for i in small) for name in names}
    choice = min(sorted(cost), key=cost.__getitem__)
    for i in small:
        group.winners[i] = choice


def _stream_sample(layers: list[nn.Module]) -> list[nn.Module]:
    sample, total = [], 0
    for layer in layers:
        sample.append(layer)
        total += _weight(layer).nbytes
        if total >= SAMPLE_BYTES:
            break
    return sample


def _identity(groups: dict[tuple, _Group], counts: list[int]) -> str:
    """What the measurements depend on: the machine, the threads, torch, the native kernels, the layers."""
    kernel = [path.read_text() for source in (small_gemm.SOURCE, gguf_native.SOURCE)  # the sources, their headers
              for path in source_files(source)]
    parts = [cpu_id(), torch.__version__, str(torch.get_num_threads()), *kernel, repr(counts), repr(SAMPLE_BYTES),
             " ".join(compile_flags())]
    parts += [repr((key, str(g.candidates.dtype), len(g.layers), sorted(g.candidates.impls), g.candidates.same_upto,
                    g.candidates.row_exact))
              for key, g in groups.items()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _read(cache: Path, groups: dict[tuple, _Group]) -> dict[tuple, tuple[str, ...]] | None:
    """The cached choices, or None where there are none (or they no longer name these layers' implementations)."""
    try:
        check_private(cache)
        entries = json.loads(cache.read_text())
        measured = {}
        for key, group in groups.items():
            names = entries.get(repr(key))
            if names is None:
                continue
            if len(names) != len(ROW_COUNTS) or not set(names) <= set(group.candidates.impls):
                return None
            measured[key] = tuple(names)
        return measured
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None


def _write(cache: Path, measured: dict[tuple, tuple[str, ...]]) -> None:
    try:
        cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as f:
            json.dump({repr(key): list(names) for key, names in measured.items()}, f)
        os.replace(f.name, cache)  # atomic: concurrent workers measuring the same model both end up with one
    except OSError as exc:
        logger.warning("could not keep the CPU linear tuning in %s: %s", cache, exc)


def _weight(layer: nn.Module) -> torch.Tensor:
    weight = getattr(layer, "qweight", None)
    return weight if isinstance(weight, torch.Tensor) else cast(torch.Tensor, layer.weight)


def _bias(layer: nn.Module) -> torch.Tensor | None:
    bias = getattr(layer, "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


def _summary(names: tuple[str, ...]) -> str:
    """'native<=4 onednn' for a run of equal choices."""
    parts: list[str] = []
    for i, name in enumerate(names):
        if i + 1 < len(names) and names[i + 1] == name:
            continue
        parts.append(name if i + 1 == len(names) else f"{name}<={ROW_COUNTS[i]}")
    return " ".join(parts)
