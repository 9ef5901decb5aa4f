"""A third-party executor backend, reached only through the register_executor_backends hook."""

from kernelcore import hookimpl


@hookimpl
def register_executor_backends(registry) -> None:
    registry.register("recording", "kc_dummy_executor.executor:RecordingExecutor")
