"""A stand-in for CUDA graphs on host tensors, for the tests.

Capturing runs the callable once and keeps it; each replay runs it again. The callable reads only the
graph runner's static buffers and the metadata object built at capture (its host values frozen, as in a
real graph), so a replay computes what a graph replay would, and a wrong copy-in, padding or size choice
shows up in the logits. Python that reads device values would still work here but not in a CUDA graph:
the GPU check (benchmarks/gpu_check.sh) covers that.
"""

from kernelcore.executor.graph_runner import GraphCaptureBackend


class RerunGraph:
    def __init__(self, fn, backend) -> None:
        self.fn, self.backend = fn, backend
        self.output = fn()

    def replay(self):
        self.backend.num_replays += 1
        self.output = self.fn()
        return self.output


class RerunCaptureBackend(GraphCaptureBackend):
    name = "rerun (test double)"

    def __init__(self) -> None:
        self.num_captures = 0
        self.num_replays = 0

    def capture(self, fn) -> RerunGraph:
        self.num_captures += 1
        return RerunGraph(fn, self)
