from kernelcore.kernels import kernel_table
from kernelcore.layers.activation import SiluAndMul
from kernelcore.layers.norm import RMSNorm
from kernelcore.layers.rotary import RotaryEmbedding


@RMSNorm.register_oot
class TritonRMSNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        if residual is None:
            return kernel_table.get("rms_norm")(x, self.weight, self.eps)
        return kernel_table.get("fused_add_rms_norm")(x, residual, self.weight, self.eps)


@RotaryEmbedding.register_oot
class TritonRotaryEmbedding(RotaryEmbedding):
    def forward_oot(self, positions, q, k):
        return kernel_table.get("rotary_embedding")(positions, q, k, self.cos_sin_cache, self.head_size,
                                                    self.rotary_dim)


@SiluAndMul.register_oot
class TritonSiluAndMul(SiluAndMul):
    def forward_oot(self, x):
        return kernel_table.get("silu_and_mul")(x)
