"""The Platform base class every platform plugin subclasses (detection and the current platform live in
:mod:`kernelcore.platforms`)."""

from __future__ import annotations

from kernelcore.contract.markers import hookimpl


class Platform:
    """Base class of every platform. One instance per process, registered with pluggy.

    Subclasses override the hook methods below (keeping the ``@hookimpl``
    marker) to take part in the platform hooks of :mod:`kernelcore.contract.hookspecs`.
    """

    device_name: str = "unspecified"
    device_type: str = "cpu"  # a torch device type
    priority: int = 0  # among several active built-in platforms, the highest wins
    dist_backend: str = "gloo"  # the torch.distributed backend executors join process groups with
    plugin_name: str = "?"  # the entry point that detected it (set by the core)
    is_builtin: bool = False  # set by the core from the entry point's distribution
    decision: dict | None = None  # why it won, and every detector's answer (set by the core)

    def is_out_of_tree(self) -> bool:
        return not self.is_builtin

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_name={self.device_name!r}, plugin={self.plugin_name!r})"

    # Default hook implementations: do nothing / pass.
    @hookimpl
    def pre_register_and_update(self, parser):
        return None

    @hookimpl
    def check_and_update_config(self, config):
        return None

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return None

    @hookimpl
    def get_device_communicator_cls(self):
        return None

    @hookimpl
    def get_graph_capture_backend_cls(self, config):
        return None
