"""The built-in NVIDIA platform: Triton attention and kernels, NCCL, bf16 by default.

Everything here runs in the front end too, so nothing creates a CUDA context: the KV-cache budget is
measured by the worker (``CudaWorker.determine_num_blocks``), compute capability comes from NVML.
"""

from __future__ import annotations

import importlib.util

from kernelcore import hookimpl
from kernelcore.contract.platform import Platform

MISSING_TRITON = ("the CUDA platform runs Triton kernels, but triton is not installed: "
                  "pip install 'kernelcore[cuda]'")


def require_triton() -> None:
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError(MISSING_TRITON)


def _compute_capability() -> tuple[int, int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0)))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


class CudaPlatform(Platform):
    device_name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"

    @hookimpl
    def check_and_update_config(self, config):
        require_triton()
        if config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "builtin_plugins.cuda.worker.CudaWorker"
        if not any(mode in config.custom_ops for mode in ("all", "none")):
            config.custom_ops.append("all")
        if config.model.dtype == "auto":
            capability = _compute_capability()
            config.model.dtype = "float16" if capability is not None and capability < (8, 0) else "bfloat16"

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return "builtin_plugins.cuda.attention.TritonAttentionBackend"

    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"  # over the nccl process group the worker joins

    @hookimpl
    def get_graph_capture_backend_cls(self, config):
        return "builtin_plugins.cuda.graphs.CudaGraphCaptureBackend"
