from kernelcore import hookimpl
from kernelcore.kernels import TORCH_REFERENCE_KERNELS
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def register_triton_kernel_overrides(self, kernels):
        # Every kernel RMSNorm declares (kernel_names) overridden: its forward_oot now runs them.
        for name in ("rms_norm", "fused_add_rms_norm"):
            if kernels.has(name):
                kernels.override(name, TORCH_REFERENCE_KERNELS[name])
