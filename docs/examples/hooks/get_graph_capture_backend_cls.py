from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def get_graph_capture_backend_cls(self, config):
        if config.parallel.tensor_parallel_size > 1:
            return None  # run every step eagerly
        return "nova_kc.graphs.NovaGraphBackend"
