from __future__ import annotations

from kernelcore import hookimpl
from kernelcore.platforms import Platform


class CudaPlatform(Platform):
    device_name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"

    @hookimpl
    def check_and_update_config(self, config):
        if config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "builtin_plugins.cuda.worker.CudaWorker"
        if not any(mode in config.custom_ops for mode in ("all", "none")):
            config.custom_ops.append("all")
        if config.model.dtype == "auto":
            config.model.dtype = "bfloat16"

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return "builtin_plugins.cuda.attention.TritonAttentionBackend"

    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"
