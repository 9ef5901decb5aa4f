"""Executors and workers: run the model for the engine core."""


def __getattr__(name: str):
    if name in ("ModelRunner", "SeqBatchEntry"):
        from kernelcore.executor import model_runner

        return getattr(model_runner, name)
    raise AttributeError(f"module 'kernelcore.executor' has no attribute {name!r}")
