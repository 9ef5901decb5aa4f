from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def check_and_update_config(self, config):
        if config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "nova_kc.worker.NovaWorker"
        config.custom_ops = ["all"]
        if config.parallel.tensor_parallel_size > 8:
            raise ValueError("a Nova board has 8 chips: --tensor-parallel-size must be at most 8")
