"""The built-in executor backends (entry point ``executors`` in kernelcore.general_plugins).

``mp``: one spawned ``worker-i`` process per rank, driven over unix sockets on one host; with
``--nnodes N`` the other hosts run ``kc serve --headless`` and their workers join over authenticated TCP.
``ray``: one Ray actor per rank on an existing Ray cluster, placed with a placement group.
"""

from kernelcore import envs, hookimpl

# Seconds of silence after which a node (or, on a node, the head) counts as lost; set it alike on every host.
# TCP's retransmission backoff makes a partition of about half this long the most a link can survive.
envs.declare("KC_CLUSTER_HEARTBEAT_TIMEOUT", lambda v: 10.0 if v is None else float(v), owner="executors")


@hookimpl
def register_executor_backends(registry) -> None:
    registry.register("mp", "builtin_plugins.executors.multiproc:MultiprocExecutor")
    registry.register("ray", "builtin_plugins.executors.ray_executor:RayExecutor")  # needs kernelcore[ray]
