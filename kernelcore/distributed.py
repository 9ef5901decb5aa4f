"""The tensor-parallel group: a communicator that parallel layers call, one per process."""

from __future__ import annotations

import torch


class Communicator:
    """A single-rank group: every collective is the identity."""

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        assert self.world_size == 1
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        assert self.world_size == 1
        return t


class TorchDistCommunicator(Communicator):
    """torch.distributed collectives (gloo, nccl, ...); a no-op with one rank."""

    def __init__(self, group=None) -> None:
        import torch.distributed as dist

        self.group = group
        if dist.is_available() and dist.is_initialized():
            super().__init__(dist.get_rank(group), dist.get_world_size(group))
        else:
            super().__init__(0, 1)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(t, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, t.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)


_tp_group: Communicator | None = None


def get_tp_group() -> Communicator:
    global _tp_group
    if _tp_group is None:
        _tp_group = Communicator()
    return _tp_group


def set_tp_group(comm: Communicator | None) -> None:
    """Install this process's tensor-parallel communicator (None: back to a single rank)."""
    global _tp_group
    _tp_group = comm


def make_device_communicator(group=None) -> Communicator:
    """The communicator class the platform names in ``get_device_communicator_cls``."""
    from kernelcore import plugins
    from kernelcore.platforms import resolve_obj_by_qualname

    qualname = plugins.get_plugin_manager().hook.get_device_communicator_cls()
    cls = resolve_obj_by_qualname(qualname) if qualname else TorchDistCommunicator
    return cls(group) if group is not None else cls()


def loopback_interface() -> str:
    """The name of the interface that carries 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    import socket

    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    raise RuntimeError("no network interface carries 127.0.0.1")


def init_distributed(world_size: int, rank: int, init_method: str | None, backend: str,
                     tensor_parallel_size: int | None = None) -> None:
    """Join the engine's process group and install the platform's communicator for this rank's
    tensor-parallel group (``tensor_parallel_size`` consecutive ranks, default: all of them; with
    fewer, the ranks form pipeline stages of that size, see :mod:`kernelcore.pipeline`).

    The executor picks the rendezvous (a file in its private directory). gloo's pair sockets
    would otherwise bind the address the hostname resolves to, possibly a LAN one, so they are
    kept on loopback unless ``GLOO_SOCKET_IFNAME`` names an interface explicitly.
    """
    from kernelcore import pipeline

    tp = tensor_parallel_size or world_size
    pipeline.set_pp_group(pipeline.PipelineGroup(rank // tp, world_size // tp, tp))
    if world_size <= 1:
        set_tp_group(None)
        return
    import os

    import torch.distributed as dist

    if backend in ("gloo", "nccl"):  # nccl's bootstrap sockets follow the hostname the same way
        os.environ.setdefault(f"{backend.upper()}_SOCKET_IFNAME", loopback_interface())
    prepare_process_group()
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size)
    if tp == world_size:
        set_tp_group(make_device_communicator())
        return
    # Every rank creates every group, in the same order.
    groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in range(world_size // tp)]
    set_tp_group(make_device_communicator(groups[rank // tp]) if tp > 1 else None)


def prepare_process_group() -> None:
    """Call before ``torch.distributed.init_process_group`` (``init_distributed`` does; an executor that joins
    the group itself calls it first): imports the torch modules whose function defaults are ``group.WORLD``.

    ``torch.distributed.nn.functional`` evaluates ``group=group.WORLD`` when it is first imported, and
    transformers imports it lazily (loading a config is enough). Imported after ``init_process_group``, its
    defaults keep the default group alive past ``destroy_process_group``: gloo's threads then outlive the
    group and die with the interpreter, which aborted ranks at exit ("terminate called without an active
    exception"). Imported first, the defaults are None.
    """
    import torch.distributed.nn.functional  # noqa: F401


def shutdown_distributed() -> None:
    """Leave the process group before the interpreter exits (gloo's threads must not outlive it)."""
    from kernelcore import pipeline

    set_tp_group(None)
    pipeline.set_pp_group(None)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
