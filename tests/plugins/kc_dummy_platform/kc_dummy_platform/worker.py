import logging

from builtin_plugins.cpu.worker import CpuWorker

logger = logging.getLogger("kc_dummy_platform")  # the vendor's own logger, not under kernelcore.*


class DummyWorker(CpuWorker):
    """The vendor's worker: the CPU worker is good enough for a host-memory device."""

    def load_model(self) -> None:
        super().load_model()
        logger.info("DummyWorker rank %d: KV block size %d, dtype %s", self.rank, self.model_runner.block_size,
                    self.model_runner.dtype)
