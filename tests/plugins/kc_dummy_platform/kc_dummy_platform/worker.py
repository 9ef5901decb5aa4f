from builtin_plugins.cpu.worker import CpuWorker


class DummyWorker(CpuWorker):
    """The vendor's worker: the CPU worker is good enough for a host-memory device."""
