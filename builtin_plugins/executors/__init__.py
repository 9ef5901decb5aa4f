"""The built-in executor backends (entry point ``executors`` in kernelcore.general_plugins).

``mp``: one spawned ``worker-i`` process per rank, driven over unix sockets on one host; with
``--nnodes N`` the other hosts run ``kc serve --headless`` and their workers join over authenticated TCP.
``ray``: one Ray actor per rank on an existing Ray cluster, placed with a placement group.
"""

from kernelcore import hookimpl


@hookimpl
def register_executor_backends(registry) -> None:
    registry.register("mp", "builtin_plugins.executors.multiproc:MultiprocExecutor")
    registry.register("ray", "builtin_plugins.executors.ray_executor:RayExecutor")  # needs kernelcore[ray]
