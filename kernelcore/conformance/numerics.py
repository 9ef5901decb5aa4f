"""Numerical checks: an attention backend against a reference attention, op replacements against forward_native."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# (total tokens, tokens computed per step): prefill from 0; then decodes beside a chunk continuing
# mid-sequence (ragged); then one all-decode step.
SEQUENCES = [(7, (5, 1, 1)), (41, (30, 10, 1)), (3, (1, 1, 1)), (22, (20, 1, 1))]
HEAD_SHAPES = [(4, 4, 32), (4, 2, 64)]  # (heads, kv heads, head size): MHA, then GQA


def _metadata(starts: list[int], lens: list[int], tables: list[list[int]], block_size: int):
    from kernelcore.attention import AttentionMetadata

    seq_lens = [s + n for s, n in zip(starts, lens, strict=True)]
    positions = [p for s, n in zip(starts, lens, strict=True) for p in range(s, s + n)]
    owners = [i for i, n in enumerate(lens) for _ in range(n)]
    slots = [tables[i][p // block_size] * block_size + p % block_size for i, p in zip(owners, positions, strict=True)]
    width = max(len(t) for t in tables)
    loc = [0]
    for n in lens:
        loc.append(loc[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(loc), seq_lens=torch.tensor(seq_lens),
        context_lens=torch.tensor(starts), block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        query_lens_list=list(lens), seq_lens_list=seq_lens, max_query_len=max(lens), max_seq_len=max(seq_lens))


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int, d: int, scale: float):
    """Causal attention over one whole sequence: q [L, H*D], k/v [L, Hkv*D] -> [L, H*D]."""
    length = q.shape[0]
    q, k, v = (x.view(length, -1, d).transpose(0, 1) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=heads != kv_heads)
    return out.transpose(0, 1).reshape(length, heads * d)


def check_attention_backend(backend_cls: Any, block_size: int, dtype: torch.dtype = torch.float32,
                            atol: float = 2e-4) -> str:
    """Run three steps of a ragged batch through the backend; raise naming the first mismatch."""
    generator = torch.Generator().manual_seed(0)
    for heads, kv_heads, d in HEAD_SHAPES:
        scale = d ** -0.5
        impl = backend_cls.make_impl(heads, d, scale, kv_heads)
        blocks_per_seq = [-(-total // block_size) for total, _ in SEQUENCES]
        order = torch.randperm(sum(blocks_per_seq), generator=generator).tolist()  # scattered blocks
        tables, at = [], 0
        for n in blocks_per_seq:
            tables.append(order[at:at + n])
            at += n
        kv_cache = torch.zeros(backend_cls.get_kv_cache_shape(len(order), block_size, kv_heads, d), dtype=dtype)
        full = [tuple(torch.randn(total, h * d, generator=generator).to(dtype) for h in (heads, kv_heads, kv_heads))
                for total, _ in SEQUENCES]
        refs = [_reference(q.float(), k.float(), v.float(), heads, kv_heads, d, scale) for q, k, v in full]
        starts = [0] * len(SEQUENCES)
        for step in range(3):
            lens = [steps[step] for _, steps in SEQUENCES]
            md = _metadata(starts, lens, tables, block_size)
            q, k, v = (torch.cat([full[i][j][s:s + n] for i, (s, n) in enumerate(zip(starts, lens, strict=True))])
                       for j in range(3))
            out = impl.forward(q, k, v, kv_cache, md).float()
            expected = torch.cat([refs[i][s:s + n] for i, (s, n) in enumerate(zip(starts, lens, strict=True))])
            diff = (out - expected).abs().max().item()
            if not diff <= atol:
                kind = ["prefill", "ragged decode + chunk", "decode"][step]
                raise AssertionError(f"{backend_cls.__name__}: heads={heads} kv_heads={kv_heads} head_size={d}, "
                                     f"{kind} step: max |out - reference| = {diff:.3g} > {atol}")
            starts = [s + n for s, n in zip(starts, lens, strict=True)]
    return f"{backend_cls.__name__} matches reference attention (MHA, GQA; prefill, ragged, decode)"


def _op_samples(key: str) -> tuple[tuple, list[tuple]] | None:
    """Constructor arguments and input tuples for the in-tree ops kernelcore ships."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "RMSNorm": ((64, 1e-5), [(rand(5, 64),), (rand(5, 64), rand(5, 64))]),
        "LayerNorm": ((64,), [(rand(5, 64),)]),
        "SiluAndMul": ((), [(rand(5, 128),)]),
        "RotaryEmbedding": ((32, 32, 128, 10000.0), [(torch.tensor([0, 3, 7, 100]), rand(4, 4 * 32), rand(4, 2 * 32))]),
    }.get(key)


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _flat(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def check_op_replacements() -> list[str]:
    """Each out-of-tree replacement subclasses its in-tree op and matches its forward_native."""
    from kernelcore.contract.config import KernelConfig, set_current_config
    from kernelcore.custom_op import _find_in_tree, op_registry_oot

    notes = []
    for key, replacement in sorted(op_registry_oot.items()):
        in_tree = _find_in_tree(key)
        if in_tree is None or not issubclass(replacement, in_tree):
            raise AssertionError(f"{replacement.__module__}.{replacement.__qualname__} replaces {key!r} "
                                 "but does not subclass the in-tree op")
        samples = _op_samples(key)
        if samples is None:
            notes.append(f"{key}: subclass ok, no sample inputs for a numeric check")
            continue
        ctor_args, inputs = samples
        with set_current_config(KernelConfig(custom_ops=["all"])):
            op = in_tree(*ctor_args)
        if type(op) is not replacement:
            raise AssertionError(f"constructing {key} gave {type(op).__name__}, not {replacement.__name__}")
        for args in inputs:
            got, want = _flat(op(*_clone(args))), _flat(op.forward_native(*_clone(args)))
            for a, b in zip(got, want, strict=False):
                if not torch.allclose(a.float(), b.float(), atol=1e-5, rtol=1e-4):
                    raise AssertionError(f"{replacement.__name__} ({op.forward_method_name}) differs from "
                                         f"{key}.forward_native by {(a.float() - b.float()).abs().max().item():.3g}")
        notes.append(f"{key} -> {replacement.__name__} ({op.forward_method_name}) matches forward_native")
    return notes or ["no op replacements in this process"]
