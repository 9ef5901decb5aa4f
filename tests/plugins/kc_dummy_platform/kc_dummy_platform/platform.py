import os

from kernelcore import hookimpl
from kernelcore.platforms import Platform


class DummyPlatform(Platform):
    device_name = "DummyDevice"
    device_type = "cpu"  # computes on host tensors, through its own forward_oot paths

    @hookimpl
    def pre_register_and_update(self, parser):
        import click

        if parser is not None and not any(p.name == "dummy_flag" for p in parser.params):
            parser.params.append(click.Option(["--dummy-flag"], default="x", help="Added by the dummy platform."))

    @hookimpl
    def apply_config_platform_defaults(self, config):
        if config.model.dtype == "auto" and os.environ.get("KC_DUMMY_DTYPE"):
            config.model.dtype = os.environ["KC_DUMMY_DTYPE"]  # the platform's default; the user's choice stays

    @hookimpl
    def check_and_update_config(self, config):
        if os.environ.get("KC_DUMMY_LEAVE_AUTO") != "1" and config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "kc_dummy_platform.worker.DummyWorker"
        config.custom_ops = ["all"]
        if config.plugin_options.get("dummy_flag") == "refuse":  # its own CLI option reaches it through the config
            raise ValueError("DummyPlatform refuses --dummy-flag=refuse")

    @hookimpl
    def update_block_size_for_backend(self, config):
        wanted = os.environ.get("KC_DUMMY_BLOCK_SIZE")
        if wanted and not config.is_user_set("cache.block_size"):
            config.cache.block_size = int(wanted)

    @hookimpl
    def validate_environ(self, config):
        if os.environ.get("KC_DUMMY_DRIVER") == "missing":
            raise RuntimeError("the DummyDevice driver is not installed (KC_DUMMY_DRIVER=missing)")

    @hookimpl
    def register_triton_kernel_overrides(self, kernels):
        from kc_dummy_platform.kernels import COUNTING_KERNELS

        for name, fn in COUNTING_KERNELS.items():
            if kernels.has(name):
                kernels.override(name, fn)

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return "kc_dummy_platform.attention.DummyAttentionBackend"

    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"
