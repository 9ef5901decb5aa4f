from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def get_attn_backend_cls(self, selector):
        if selector.head_size > 256:
            return None  # pass: another plugin (or the core's error) decides
        return "builtin_plugins.cpu.attention.CpuAttentionBackend"
