"""Quality of quantized weights: logits vs the fp32 unquantized model, KL divergence and top-1 agreement.

    python benchmarks/quant_quality.py                         # Llama-125M shape, 4 x 128 positions
    python benchmarks/quant_quality.py --shape opt --num-seqs 8
    python benchmarks/quant_quality.py --gguf                  # + GGUF Q8_0/Q4_0 files of the same checkpoint

Every position of random prompts gets logits (one prefill each, logits for all rows); the table gives, per
variant, mean and max KL(p_fp32 || p_variant) in nats and the share of positions whose argmax agrees.
With ``--gguf`` the checkpoint is also written as Q8_0 and Q4_0 GGUF files (gguf.GGUFWriter, llama.cpp's layout,
tests/gguf_helpers.py) and served as files are by default (Q8_0/Q4_0 layers repacked to per-channel int8) and
dequantized (``--quantization none``, the file's exact values); "repacking" rows compare those two.
The checkpoint has random weights (std 0.02, transformers' init), so figures are a property of the
rounding, not of a trained model's sensitivity.
"""

from __future__ import annotations

import os
import sys
import tempfile

import click
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import SHAPES, build_checkpoint  # noqa: E402

VARIANTS = {"fp32 int8": ("float32", "int8"), "bf16": ("bfloat16", None), "bf16 int8": ("bfloat16", "int8")}


def full_logits(path: str, dtype: str, quantization: str | None, seqs: list[list[int]]) -> torch.Tensor:
    """Float32 logits of every position of every sequence, concatenated [sum(len), vocab]."""
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner, SeqBatchEntry

    config = build_config(model=path, dtype=dtype, quantization=quantization, block_size=16)
    runner = ModelRunner(config)
    runner.load_model()
    num_blocks = -(-max(len(s) for s in seqs) // 16)
    runner.allocate_kv_cache(num_blocks)
    out = [runner.execute([SeqBatchEntry(s, 0, list(range(num_blocks)), num_logits=len(s))]).clone() for s in seqs]
    return torch.cat(out)


def divergence(ref: torch.Tensor, logits: torch.Tensor) -> dict:
    ref_logp, logp = ref.log_softmax(-1), logits.float().log_softmax(-1)
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    top1 = (ref.argmax(-1) == logits.argmax(-1)).float()
    return dict(kl_mean=kl.mean().item(), kl_max=kl.max().item(), top1=top1.mean().item(), positions=len(kl))


@click.command()
@click.option("--shape", type=click.Choice(list(SHAPES)), default="llama", show_default=True)
@click.option("--num-seqs", type=int, default=4, show_default=True)
@click.option("--seq-len", type=int, default=128, show_default=True)
@click.option("--checkpoint-dir", type=click.Path(), default=None)
@click.option("--gguf", is_flag=True, help="Also GGUF Q8_0/Q4_0 files of the checkpoint (Llama shape only).")
def main(shape, num_seqs, seq_len, checkpoint_dir, gguf):
    """KL divergence and top-1 agreement of int8/bf16 vs fp32, same prompts."""
    path = build_checkpoint(shape, checkpoint_dir or tempfile.mkdtemp(prefix="kc-quality-"))
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(4, SHAPES[shape]["vocab_size"], (num_seqs, seq_len), generator=g).tolist()
    ref = full_logits(path, "float32", None, seqs)
    click.echo(f"| variant ({shape}, {ref.shape[0]} positions) | mean KL (nats) | max KL | top-1 agreement |")
    click.echo("|---|---|---|---|")
    for name, (dtype, quantization) in VARIANTS.items():
        d = divergence(ref, full_logits(path, dtype, quantization, seqs))
        click.echo(f"| {name} | {d['kl_mean']:.2e} | {d['kl_max']:.2e} | {d['top1']:.1%} |")
    if gguf:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
        from gguf_helpers import write_gguf

        for qtype in ("Q8_0", "Q4_0"):
            file = os.path.join(path, f"model-{qtype}.gguf")
            if not os.path.isfile(file):
                write_gguf(path, file, qtype, with_vocab=False)
            exact = full_logits(file, "float32", "none", seqs)
            repacked = full_logits(file, "float32", None, seqs)
            for name, (a, b) in {f"gguf {qtype} dequantized": (ref, exact), f"gguf {qtype} as int8": (ref, repacked),
                                 f"repacking ({qtype} as int8 vs {qtype})": (exact, repacked)}.items():
                d = divergence(a, b)
                click.echo(f"| {name} | {d['kl_mean']:.2e} | {d['kl_max']:.2e} | {d['top1']:.1%} |")


if __name__ == "__main__":
    main()
