"""The in-tree ops' forward_oot runs their forward_cuda: the kernel table's (Triton) kernels, on host tensors."""

from kernelcore.layers import RMSNorm, RotaryEmbedding, SiluAndMul


@RMSNorm.register_oot
class TritonRMSNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        return self.forward_cuda(x, residual)


@RotaryEmbedding.register_oot
class TritonRotaryEmbedding(RotaryEmbedding):
    def forward_oot(self, positions, q, k):
        return self.forward_cuda(positions, q, k)


@SiluAndMul.register_oot
class TritonSiluAndMul(SiluAndMul):
    def forward_oot(self, x):
        return self.forward_cuda(x)
