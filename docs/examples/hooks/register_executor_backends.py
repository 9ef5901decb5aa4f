from kernelcore import hookimpl


@hookimpl
def register_executor_backends(registry):
    # a string is imported only when chosen: kc serve --distributed-executor-backend slurm
    registry.register("slurm", "nova_kc.slurm:SlurmExecutor")
