from builtin_plugins.cpu.attention import CpuAttentionBackend


class DummyAttentionBackend(CpuAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "Dummy_Backend"
