"""CUDA graphs for the decode forward: the CUDA platform's GraphCaptureBackend.

Every graph of a worker shares one memory pool (captured largest first, the smaller ones reuse its memory).
Before each capture the forward runs once eagerly on a side stream, so Triton compiles its kernels and
torch creates its handles outside the capture.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelcore.executor.graph_runner import GraphCaptureBackend


class CudaGraph:
    def __init__(self, graph: torch.cuda.CUDAGraph, output: torch.Tensor) -> None:
        self.graph, self.output = graph, output

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class CudaGraphCaptureBackend(GraphCaptureBackend):
    name = "CUDA"

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> CudaGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up: compiles and allocates outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = fn()
        torch.cuda.synchronize()
        return CudaGraph(graph, output)
