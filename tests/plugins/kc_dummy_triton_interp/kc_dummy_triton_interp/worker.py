from builtin_plugins.cpu.worker import CpuWorker


class TritonInterpWorker(CpuWorker):
    def load_model(self) -> None:
        import kc_dummy_triton_interp.ops  # noqa: F401  (register_oot, before any op is built)

        super().load_model()
