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
    def check_and_update_config(self, config):
        if os.environ.get("KC_DUMMY_LEAVE_AUTO") != "1" and config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "kc_dummy_platform.worker.DummyWorker"
        config.custom_ops = ["all"]
        if config.plugin_options.get("dummy_flag") == "refuse":  # its own CLI option reaches it through the config
            raise ValueError("DummyPlatform refuses --dummy-flag=refuse")

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return "kc_dummy_platform.attention.DummyAttentionBackend"

    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"
