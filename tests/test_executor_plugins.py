"""Executors are plugins: the built-in ``mp`` and a third-party backend reach the engine through the
register_executor_backends hook and are selected by name."""

import json

import pytest
from helpers import run_kc, run_python

pytestmark = pytest.mark.slow  # spawns engines and workers


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)


def test_registry_names_the_plugin_of_each_backend_and_refuses_duplicates():
    proc = run_python("""
        import json
        from kernelcore.executor.registry import ExecutorRegistry, UnknownExecutorError, build_registry
        registry = build_registry()
        try:
            registry.get_cls("nope")
        except UnknownExecutorError as exc:
            unknown = str(exc)
        try:
            registry.register("mp", "x:Y")
        except ValueError as exc:
            duplicate = str(exc)
        print(json.dumps({"names": registry.names(), "plugins": {n: registry.plugin_of(n) for n in registry.names()},
                          "mp": registry.get_cls("mp").__module__, "unknown": unknown, "duplicate": duplicate}))
    """)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"uni", "mp", "recording"} <= set(out["names"])
    assert out["plugins"]["mp"] == "executors" and out["plugins"]["recording"] == "dummy_executor"
    assert out["plugins"]["uni"] == "kernelcore"
    assert out["mp"] == "builtin_plugins.executors.multiproc"
    assert "'nope'" in out["unknown"] and "recording" in out["unknown"]
    assert "already registered by plugin 'executors'" in out["duplicate"]


GREEDY = """
import json, os
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
if __name__ == "__main__":
    core = EngineCore(build_config(model=MODEL, kv_cache_memory=1 << 24, BACKEND))
    for i, p in enumerate([[5, 9, 14, 3], list(range(30, 50))]):
        core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=p, sampling_params=SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True)))
    tokens = {}
    while core.has_unfinished_requests():
        for o in core.step().outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    core.shutdown()
    print(json.dumps({"tokens": tokens, "executor": type(core.executor).__name__, "pid": os.getpid()}))
"""


def _greedy(llama_dir, backend_kwargs, **env):
    script = GREEDY.replace("MODEL", repr(llama_dir)).replace("BACKEND", backend_kwargs)
    return json.loads(run_python(script, **env).stdout.strip().splitlines()[-1])


def test_a_third_party_executor_is_selected_by_name_and_drives_the_engine(llama_dir, tmp_path):
    log = tmp_path / "calls.jsonl"
    reference = _greedy(llama_dir, "tensor_parallel_size=1")
    assert reference["executor"] == "UniProcExecutor"
    out = _greedy(llama_dir, "distributed_executor_backend='recording'", KC_DUMMY_EXECUTOR_LOG=str(log))
    assert out["executor"] == "RecordingExecutor" and out["tokens"] == reference["tokens"]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    names = [c["call"] for c in calls]
    assert names[:3] == ["create_worker", "determine_num_blocks", "initialize_cache"] and names[-1] == "shutdown"
    assert names.count("execute_model") >= 8 and {c["pid"] for c in calls} == {out["pid"]}


def test_without_the_builtin_executor_plugin_tp2_fails_naming_the_backend(llama_dir):
    proc = run_python(GREEDY.replace("MODEL", repr(llama_dir)).replace("BACKEND", "tensor_parallel_size=2"),
                      check=False, KC_BLOCK_PLUGINS="executors")
    assert proc.returncode != 0 and "unknown executor backend 'mp'" in proc.stderr


def test_kc_serve_refuses_an_unknown_backend_before_starting():
    proc = run_kc("serve", "--distributed-executor-backend", "nope", check=False, timeout=120)
    assert proc.returncode == 2 and "unknown executor backend 'nope'" in proc.stderr
