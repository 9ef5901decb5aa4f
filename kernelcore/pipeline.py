"""Pipeline parallelism: the ranks form ``pipeline_parallel_size`` stages of ``tensor_parallel_size`` ranks;
stage s holds a contiguous slice of the decoder layers and hands its hidden states to stage s + 1.

Every tensor-parallel rank of a stage sends to the same tensor-parallel rank of the next one (the hidden
states are replicated inside a stage). Models opt in with ``supports_pipeline_parallel = True``: they build
only :func:`stage_layers` (the others are :class:`PPMissingLayer`), the embedding on the first stage, the
final norm and head on the last, and take/return intermediate tensors (a dict of :data:`INTERMEDIATE_KEYS`).
"""

from __future__ import annotations

import torch
from torch import nn

INTERMEDIATE_KEYS = ("hidden", "residual")  # what a stage may hand on, in wire order


class PPMissingLayer(nn.Identity):
    """A placeholder for a layer another stage holds (no parameters, never called)."""


class PipelineGroup:
    def __init__(self, stage: int = 0, num_stages: int = 1, tp_size: int = 1) -> None:
        self.stage, self.num_stages, self.tp_size = stage, num_stages, tp_size

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def _peer(self, offset: int) -> int:
        import torch.distributed as dist

        return dist.get_rank() + offset * self.tp_size

    def send(self, tensors: dict[str, torch.Tensor | None]) -> None:
        """Hand this stage's outputs to the next stage: a header (which keys, their shapes), then each tensor."""
        import torch.distributed as dist

        header = torch.zeros(3 * len(INTERMEDIATE_KEYS), dtype=torch.long)
        present = [(i, t) for i, k in enumerate(INTERMEDIATE_KEYS) if (t := tensors.get(k)) is not None]
        for i, t in present:
            header[3 * i:3 * i + 3] = torch.tensor([1, t.shape[0], t.shape[1]])
        dist.send(header, self._peer(1))
        for _, t in present:
            dist.send(t.contiguous(), self._peer(1))

    def recv(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        import torch.distributed as dist

        header = torch.zeros(3 * len(INTERMEDIATE_KEYS), dtype=torch.long)
        dist.recv(header, self._peer(-1))
        out = {}
        for i, key in enumerate(INTERMEDIATE_KEYS):
            flag, rows, cols = header[3 * i:3 * i + 3].tolist()
            if flag:
                out[key] = torch.empty(rows, cols, dtype=dtype, device=device)
                dist.recv(out[key], self._peer(-1))
        return out


_pp_group: PipelineGroup | None = None


def get_pp_group() -> PipelineGroup:
    return _pp_group or PipelineGroup()


def set_pp_group(group: PipelineGroup | None) -> None:
    global _pp_group
    _pp_group = group


def stage_layers(num_layers: int) -> tuple[int, int]:
    """[start, end) of the decoder layers this rank's stage holds (the first stages take the remainder)."""
    pp = get_pp_group()
    base, extra = divmod(num_layers, pp.num_stages)
    start = pp.stage * base + min(pp.stage, extra)
    return start, start + base + (pp.stage < extra)


def make_layers(num_layers: int, build) -> tuple[int, int, nn.ModuleList]:
    """``build(i)`` for this stage's layers, a PPMissingLayer for the others."""
    start, end = stage_layers(num_layers)
    return start, end, nn.ModuleList(build(i) if start <= i < end else PPMissingLayer() for i in range(num_layers))
