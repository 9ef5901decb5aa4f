"""Decode graphs on the CPU: the capture/replay bookkeeping of kernelcore.executor.graph_runner, driven by the
test double of the kc_dummy_triton_interp plugin (capture keeps the callable, a replay re-runs it on the static
buffers) and by the CPU platform's own kernel tapes (builtin_plugins/cpu/graphs.py). A graph runner and an
eager runner load the same checkpoint and take the same steps; their logits and KV caches must agree for every
batch size, padded or not, and steps a graph cannot take must fall back.

With KC_TEST_DEVICE=cuda (benchmarks/gpu_check.sh) the same steps run on the GPU through the CUDA platform's
real CUDA graphs instead of the double."""

import json
import os

import pytest
import torch
from conftest_models import make_llama_checkpoint, make_opt_checkpoint

from kernelcore import hookimpl, plugins
from kernelcore.config_builder import build_config
from kernelcore.executor.graph_runner import GraphCaptureBackend, capture_sizes
from kernelcore.executor.model_runner import ModelRunner
from kernelcore.executor.model_runner import SeqBatchEntry as E

pytest.importorskip("kc_dummy_triton_interp", reason="bash scripts/test.sh installs the dummy plugins")

BLOCK_SIZE, NUM_BLOCKS = 4, 48
SIZES = [1, 4, 8]
DEVICE = os.environ.get("KC_TEST_DEVICE", "cpu")
TOL = dict(atol=1e-5, rtol=1e-5) if DEVICE == "cpu" else dict(atol=1e-4, rtol=1e-4)  # tf32 dots in attention
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="the CPU platform and the test double")


class GraphsOnCpu:
    """A plugin lending the CPU platform the test double instead of its own kernel tapes."""

    @hookimpl
    def get_graph_capture_backend_cls(self, config):
        return "kc_dummy_triton_interp.graphs.RerunCaptureBackend"


@pytest.fixture(params=["double", "platform"])
def graphs_plugin(request):
    if DEVICE != "cpu" or request.param == "platform":  # the platform's own graphs (CUDA graphs, CPU tapes)
        yield
        return
    pm = plugins.get_plugin_manager()
    plugin = GraphsOnCpu()
    pm.register(plugin, name="test-graphs-on-cpu")
    yield
    pm.unregister(plugin)


@pytest.fixture(scope="module", params=["llama", "opt"])
def checkpoint(request, tmp_path_factory):
    make = make_llama_checkpoint if request.param == "llama" else make_opt_checkpoint
    return make(str(tmp_path_factory.mktemp(request.param) / "ckpt"))


def make_runner(path: str, **kwargs) -> ModelRunner:
    kwargs.setdefault("graph_capture_sizes", SIZES)
    config = build_config(model=path, dtype="float32", block_size=BLOCK_SIZE, max_num_seqs=16, **kwargs)
    if DEVICE == "cpu":
        runner = ModelRunner(config)
    else:
        from builtin_plugins.cuda.worker import CudaModelRunner

        runner = CudaModelRunner(config, torch.device(DEVICE))
    runner.load_model()
    runner.allocate_kv_cache(NUM_BLOCKS)
    return runner


class Sequences:
    """Eleven sequences with scattered block tables, stepped identically on every runner. The last one
    takes over the blocks of sequence 7 once that one is done (as the scheduler reuses freed blocks)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        lens = (5, 9, 3, 12, 7, 4, 6, 10, 2, 8, 13)
        self.tokens = [torch.randint(3, 300, (n,), generator=g).tolist() for n in lens]
        free = torch.randperm(NUM_BLOCKS, generator=g).tolist()
        self.tables = [[free.pop() for _ in range(4)] for _ in lens[:-1]]  # room for 16 tokens each
        self.tables.append(self.tables[7])
        self.done = [0] * len(lens)

    def prefill(self, seqs) -> list[E]:
        entries = [E(self.tokens[i], 0, self.tables[i]) for i in seqs]
        for i in seqs:
            self.done[i] = len(self.tokens[i])
        return entries

    def decode(self, seqs, step: int) -> list[E]:
        entries = [E([(7 * i + step) % 300 + 3], self.done[i], self.tables[i]) for i in seqs]
        for i in seqs:
            self.done[i] += 1
        return entries


def run_both(graph: ModelRunner, eager: ModelRunner, entries: list[E]) -> torch.Tensor:
    got, want = graph.execute(entries).clone(), eager.execute(entries).clone()
    torch.testing.assert_close(got, want, **TOL)
    return got


def test_padded_decode_graphs_match_eager_and_write_only_their_slots(graphs_plugin, checkpoint):
    graph, eager = make_runner(checkpoint), make_runner(checkpoint, enforce_eager=True)
    runner = graph.graph_runner
    assert eager.graph_runner is None and runner is not None
    assert sorted(runner.graphs) == SIZES and getattr(runner.backend, "num_captures", len(SIZES)) == len(SIZES)
    assert graph.kv_caches[0].shape[1] == eager.kv_caches[0].shape[1] + 1  # the spare block for padded rows

    seqs = Sequences()
    run_both(graph, eager, seqs.prefill(range(10)))
    assert runner.num_replays == 0  # prefill runs eagerly
    run_both(graph, eager, seqs.decode(range(8), 0))  # fills the graph of 8
    run_both(graph, eager, seqs.prefill([10]))  # sequence 7 is done; 10 now owns its blocks
    # 5 pads to 8 over rows the step of 8 used (one held sequence 7's last slot, now 10's); 3 pads to 4;
    # 1 and 4 fit exactly.
    for step, batch in enumerate([[0, 2, 4, 6, 10], [1, 3, 10], [9], [0, 1, 2, 3]], start=1):
        run_both(graph, eager, seqs.decode(batch, step))
        assert runner.num_replays == getattr(runner.backend, "num_replays", step + 1) == step + 1
    # The scheduler's blocks hold the same keys and values: padded rows wrote only the spare block.
    for got, want in zip(graph.kv_caches, eager.kv_caches, strict=True):
        torch.testing.assert_close(got[:, :NUM_BLOCKS], want, **TOL)


def test_steps_a_graph_cannot_take_run_eagerly(graphs_plugin, checkpoint):
    graph, eager = make_runner(checkpoint), make_runner(checkpoint, enforce_eager=True)
    runner = graph.graph_runner
    seqs = Sequences()
    run_both(graph, eager, seqs.prefill(range(6)))
    run_both(graph, eager, seqs.prefill([6, 7]) + seqs.decode(range(6), 0))  # mixed: prefills with decodes
    assert runner.num_replays == 0
    run_both(graph, eager, seqs.prefill([8, 9]))
    run_both(graph, eager, seqs.decode(range(10), 1))  # 10 decodes: above the largest captured size
    assert runner.num_replays == 0
    no_logit = seqs.decode([0, 1], 2)
    no_logit[1].num_logits = 0  # a row without logits: not the captured shape
    run_both(graph, eager, no_logit)
    assert runner.num_replays == 0
    run_both(graph, eager, seqs.decode(range(2), 3))
    assert runner.num_replays == 1


def test_enforce_eager_and_platforms_without_graphs_capture_nothing(graphs_plugin, checkpoint):
    runner = make_runner(checkpoint, enforce_eager=True)
    assert runner.graph_runner is None and runner.kv_caches[0].shape[1] == NUM_BLOCKS


@cpu_only
def test_the_cpu_platform_records_kernel_tapes_for_small_batches_only(checkpoint, monkeypatch):
    from builtin_plugins.cpu.graphs import CpuGraphBackend, CpuTape

    runner = make_runner(checkpoint)
    assert isinstance(runner.graph_runner.backend, CpuGraphBackend)
    assert all(isinstance(g, CpuTape) and g.calls for g in runner.graph_runner.graphs.values())
    limit = runner.graph_runner.backend.max_capture_size
    runner = make_runner(checkpoint, graph_capture_sizes=[1, limit, limit + 8])
    assert sorted(runner.graph_runner.graphs) == [1, limit]  # each tape keeps its own buffers: small ones only
    # a lone request's speculative verification (drafts + 1 rows) is captured past the limit, and nothing else
    spec = {"method": "ngram", "num_speculative_tokens": limit + 2}
    runner = make_runner(checkpoint, graph_capture_sizes=None, speculative_config=spec)
    assert sorted(runner.graph_runner.graphs) == list(range(1, limit + 4))
    # a backend whose limit is 0 captures nothing, verification sizes included
    monkeypatch.setattr(CpuGraphBackend, "__init__", lambda self: setattr(self, "max_capture_size", 0))
    assert make_runner(checkpoint, graph_capture_sizes=None, speculative_config=spec).graph_runner is None


@cpu_only
def test_a_cpu_tape_refuses_a_forward_that_reads_values_on_the_host():
    from builtin_plugins.cpu.graphs import CaptureRefused, CpuGraphBackend

    x = torch.ones(3)
    with pytest.raises(CaptureRefused, match="host"):
        CpuGraphBackend().capture(lambda: x * float(x.sum()))
    with pytest.raises(CaptureRefused, match="host"):
        CpuGraphBackend().capture(lambda: x * len((x > 0).tolist()))
    with pytest.raises(CaptureRefused, match="shapes depend"):
        CpuGraphBackend().capture(lambda: x[x > 0])
    assert x.tolist() == [1.0, 1.0, 1.0]  # tolist is itself again
    tape = CpuGraphBackend().capture(lambda: (x * 2).add_(1))
    x.fill_(5)
    assert tape.replay().tolist() == [11.0, 11.0, 11.0]  # replays see the inputs' new values


def test_a_hook_naming_something_else_is_a_clear_error(checkpoint):
    class NotABackend:
        @hookimpl
        def get_graph_capture_backend_cls(self, config):
            return "collections.OrderedDict"

    pm = plugins.get_plugin_manager()
    plugin = NotABackend()
    pm.register(plugin, name="test-not-a-backend")
    try:
        with pytest.raises(TypeError, match="collections.OrderedDict.*not a GraphCaptureBackend"):
            make_runner(checkpoint)
    finally:
        pm.unregister(plugin)
    from builtin_plugins.cuda.graphs import CudaGraphCaptureBackend  # importable without a GPU

    assert issubclass(CudaGraphCaptureBackend, GraphCaptureBackend)


class FailingCapture(GraphCaptureBackend):
    name = "failing"

    def capture(self, fn):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")


@cpu_only
def test_a_model_that_cannot_be_captured_runs_eagerly(checkpoint, caplog):
    class Failing:
        @hookimpl
        def get_graph_capture_backend_cls(self, config):
            return f"{__name__}.FailingCapture"

    pm = plugins.get_plugin_manager()
    plugin = Failing()
    pm.register(plugin, name="test-failing-capture")
    try:
        graph = make_runner(checkpoint)
    finally:
        pm.unregister(plugin)
    assert graph.graph_runner is None
    assert "Could not capture failing decode graphs" in caplog.text and "not permitted" in caplog.text
    eager, seqs = make_runner(checkpoint, enforce_eager=True), Sequences()
    run_both(graph, eager, seqs.prefill(range(3)))
    run_both(graph, eager, seqs.decode(range(3), 0))


def test_capture_sizes(checkpoint):
    def sizes(max_num_seqs, chosen=None):
        return capture_sizes(build_config(model=checkpoint, max_num_seqs=max_num_seqs, graph_capture_sizes=chosen))

    assert sizes(128) == [1, 2, 4, *range(8, 129, 8)]
    assert sizes(3) == [1, 2, 3]
    assert sizes(20) == [1, 2, 4, 8, 16, 20]
    assert sizes(1000)[-1] == 256
    assert sizes(16, [32, 2, 8, 2]) == [2, 8]  # none above max_num_seqs, each once
    # Speculative decoding: a lone request's verification of k drafts is k + 1 decode rows, each size captured
    # (else 5 rows would replay the graph of 8), even above max_num_seqs.
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    assert capture_sizes(build_config(model=checkpoint, max_num_seqs=16, speculative_config=spec)) == [
        1, 2, 3, 4, 5, 8, 16]
    assert capture_sizes(build_config(model=checkpoint, max_num_seqs=1, speculative_config=spec)) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="positive"):
        sizes(16, [0, 4])


GENERATE = """
import json, sys
from kernelcore import LLM, SamplingParams

path = sys.argv[1]
prompts = [{"prompt_token_ids": p} for p in ([5, 9, 11, 3, 7], list(range(40, 58)), [3, 4, 8])]
params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
report = {}
for eager in (False, True):
    llm = LLM(path, dtype="float32", enforce_eager=eager, kv_cache_memory=4 << 20)
    outs = llm.generate(prompts, params, use_tqdm=False)
    graphs = llm.engine_core.executor.worker.model_runner.graph_runner
    report["eager" if eager else "graphs"] = {
        "tokens": [o.outputs[0].token_ids for o in outs],
        "logprobs": [[{str(k): v.logprob for k, v in step.items()} for step in o.outputs[0].logprobs] for o in outs],
        "graphs": None if graphs is None else {"backend": graphs.backend.name, "sizes": sorted(graphs.graphs),
                                               "replays": graphs.num_replays}}
    llm.shutdown()
print(json.dumps(report))
"""


@cpu_only
@pytest.mark.slow
def test_vendor_platform_generates_through_its_decode_graphs(tmp_path):
    """The kc_dummy_triton_interp platform names the double through the hook; the offline LLM then decodes
    through captured sizes 1, 2, 4 (Triton kernels in the interpreter) exactly as its eager twin does."""
    pytest.importorskip("triton", reason="pip install 'kernelcore[cuda]'")
    from helpers import run_python

    path = make_llama_checkpoint(str(tmp_path / "llama"))
    proc = run_python(GENERATE.replace("sys.argv[1]", repr(path)), KC_TRITON_INTERP="1", TRITON_INTERPRET="1")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    graphs, eager = report["graphs"], report["eager"]
    assert eager["graphs"] is None
    assert graphs["graphs"]["backend"] == "rerun (test double)" and graphs["graphs"]["sizes"] == [1, 2, 4]
    assert graphs["graphs"]["replays"] >= 5  # every decode step of the three sequences (3 pads to 4)
    assert graphs["tokens"] == eager["tokens"] and all(len(t) == 6 for t in eager["tokens"])
    for got, want in zip(graphs["logprobs"], eager["logprobs"], strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            assert all(abs(g[k] - w[k]) < 1e-4 for k in g)
