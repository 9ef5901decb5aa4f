import os
import sys

from kernelcore import hookimpl
from kernelcore.platforms import Platform


class TritonInterpPlatform(Platform):
    device_name = "TritonInterp"
    device_type = "cpu"  # host tensors; its custom ops run forward_oot, which launches the Triton kernels

    def __init__(self) -> None:
        # Triton picks interpreted or compiled functions when each @triton.jit runs, its own library's included.
        if os.environ.get("TRITON_INTERPRET") != "1" and "triton" in sys.modules:
            raise RuntimeError("triton was imported before the TritonInterp platform could set TRITON_INTERPRET=1; "
                               "set TRITON_INTERPRET=1 in the environment")
        os.environ["TRITON_INTERPRET"] = "1"

    @hookimpl
    def check_and_update_config(self, config):
        if config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "kc_dummy_triton_interp.worker.TritonInterpWorker"
        config.custom_ops = ["all"]
        if config.model.dtype == "auto":
            config.model.dtype = "float32"  # bf16 arithmetic is broken in the interpreter
        if config.model.graph_capture_sizes is None:
            config.model.graph_capture_sizes = [1, 2, 4]  # each capture is a forward in the interpreter

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return "builtin_plugins.cuda.attention.TritonAttentionBackend"

    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"

    @hookimpl
    def get_graph_capture_backend_cls(self, config):
        return "kc_dummy_triton_interp.graphs.RerunCaptureBackend"  # a vendor platform's decode graphs
