"""In-tree layers: tensor-parallel linears and embeddings, custom ops, and the Attention layer.

Model authors import from here (``from kernelcore.layers import RotaryEmbedding``); the submodules
are implementation detail. docs/models.md describes each layer's contract.
"""

from kernelcore.layers.activation import SiluAndMul
from kernelcore.layers.attention import Attention
from kernelcore.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from kernelcore.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from kernelcore.layers.norm import LayerNorm, RMSNorm
from kernelcore.layers.rotary import RotaryEmbedding, get_rope

__all__ = ["Attention", "ColumnParallelLinear", "LayerNorm", "LinearBase", "MergedColumnParallelLinear",
           "ParallelLMHead", "QKVParallelLinear", "RMSNorm", "ReplicatedLinear", "RotaryEmbedding",
           "RowParallelLinear", "SiluAndMul", "VocabParallelEmbedding", "get_rope"]
