"""Process topology: engine core in its own process, TP workers, failure handling, plugin trace per process."""

import json
import os
import signal
import time

import psutil
import pytest
from helpers import run_python

pytestmark = pytest.mark.slow  # real servers / several processes: run with the full suite

TESTS_DIR = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)


@pytest.fixture(scope="module")
def opt_dir(tmp_path_factory):
    from conftest_models import make_opt_checkpoint

    return make_opt_checkpoint(str(tmp_path_factory.mktemp("opt")))


def _greedy_with_logprobs(model_dir, tp, num_steps=32):
    """Run in a fresh interpreter (TP workers are spawned; the script needs a main guard)."""
    out = run_python(f"""
        import json
        from kernelcore.config_builder import build_config
        from kernelcore.engine.core import EngineCore
        from kernelcore.engine.request import EngineCoreRequest
        from kernelcore.core_types.sampling_params import SamplingParams
        if __name__ == "__main__":
            core = EngineCore(build_config(model={model_dir!r}, tensor_parallel_size={tp}, kv_cache_memory=1 << 24))
            prompts = [[5, 9, 14, 3, 7, 11, 2, 8], [17, 4, 4, 12], list(range(30, 70))]
            for i, p in enumerate(prompts):
                core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=p,
                                                   sampling_params=SamplingParams(temperature=0, max_tokens={num_steps},
                                                                                  ignore_eos=True, logprobs=5)))
            tokens, logprobs = {{}}, {{}}
            while core.has_unfinished_requests():
                for o in core.step().outputs:
                    tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                    logprobs.setdefault(o.request_id, []).extend(lp.logprobs for lp in o.new_logprobs or [])
            core.shutdown()
            print(json.dumps([tokens, logprobs]))
    """)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["llama", "opt"])
def test_tensor_parallel_2_matches_1(model, llama_dir, opt_dir):
    model_dir = llama_dir if model == "llama" else opt_dir
    tokens_1, logprobs_1 = _greedy_with_logprobs(model_dir, 1)
    tokens_2, logprobs_2 = _greedy_with_logprobs(model_dir, 2)
    assert tokens_1 == tokens_2 and all(len(t) == 32 for t in tokens_1.values())
    for rid in logprobs_1:
        for a, b in zip(logprobs_1[rid], logprobs_2[rid], strict=True):
            assert a == pytest.approx(b, abs=2e-4)


ASYNC_SCRIPT = """
import asyncio, json, os, signal, sys, time
from kernelcore.config_builder import build_config
from kernelcore.engine.async_llm import AsyncLLM, EngineDeadError
from kernelcore.core_types.sampling_params import SamplingParams


async def main():
    llm = await AsyncLLM.create(build_config(model=MODEL, tensor_parallel_size=TP, kv_cache_memory=1 << 24))
    import psutil
    children = [p.pid for p in psutil.Process().children(recursive=True) if "kc::" in " ".join(p.cmdline())]
    print(json.dumps({"children": children}), flush=True)
    params = SamplingParams(temperature=0, max_tokens=100000 // 1000, ignore_eos=True)
    gen = llm.generate("a", [5, 6, 7], SamplingParams(max_tokens=200, ignore_eos=True))
    await gen.__anext__()
    victim = [p for p in psutil.Process().children(recursive=True) if VICTIM in " ".join(p.cmdline())][0]
    started = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    try:
        async for _ in gen:
            pass
        result = "finished"
    except EngineDeadError as exc:
        result = "dead: " + str(exc)
    elapsed = time.monotonic() - started
    try:
        async for _ in llm.generate("b", [1, 2], params):
            pass
        second = "served"
    except EngineDeadError:
        second = "refused"
    await llm.shutdown()
    print(json.dumps({"result": result, "elapsed": elapsed, "is_dead": llm.is_dead, "second": second}), flush=True)

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.parametrize("victim", ["kc::worker-1", "kc::engine-core"])
def test_killing_a_worker_or_the_engine_core_fails_requests_promptly_and_leaves_no_orphans(victim, llama_dir):
    script = ASYNC_SCRIPT.replace("MODEL", repr(llama_dir)).replace("TP", "2").replace("VICTIM", repr(victim))
    proc = run_python(script, timeout=300)
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines() if line.startswith("{")]
    children, result = lines[0]["children"], lines[1]
    assert len(children) == 3  # engine-core, worker-0, worker-1
    assert result["result"].startswith("dead") and result["elapsed"] < 10
    assert result["is_dead"] and result["second"] == "refused"
    deadline = time.time() + 10
    while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                         for p in children):
        time.sleep(0.2)
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_sigterm_to_the_front_end_takes_every_child_down(llama_dir):
    import subprocess
    import sys

    from helpers import clean_env

    script = ASYNC_SCRIPT.replace("MODEL", repr(llama_dir)).replace("TP", "2").replace("VICTIM", "'never'")
    script = script.replace("    gen = llm.generate", "    await asyncio.sleep(600)\n    gen = llm.generate")
    front = subprocess.Popen([sys.executable, "-c", script], env=clean_env(), stdout=subprocess.PIPE, text=True)
    children = json.loads(front.stdout.readline())["children"]
    assert len(children) == 3
    front.send_signal(signal.SIGTERM)
    front.wait(30)
    deadline = time.time() + 10
    while time.time() < deadline and any(psutil.pid_exists(p) for p in children):
        time.sleep(0.2)
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_trace_of_a_tp2_start_shows_every_process_in_order(llama_dir, tmp_path):
    trace = tmp_path / "trace.jsonl"
    run_python(f"""
        from kernelcore.config_builder import build_config
        from kernelcore.engine.core_client import MPEngineCoreClient
        if __name__ == "__main__":
            client = MPEngineCoreClient(build_config(model={llama_dir!r}, tensor_parallel_size=2,
                                                     kv_cache_memory=1 << 24))
            client.shutdown()
    """, KC_TRACE_PLUGINS=str(trace))
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    by_role = {}
    for e in events:
        by_role.setdefault(e["role"], []).append(e)
    assert set(by_role) == {"frontend", "engine-core", "worker-0", "worker-1"}
    assert len({e["pid"] for e in events}) == 4
    for role, mine in by_role.items():
        hooks = [e["hook"] for e in mine]
        assert hooks.count("platform_resolved") == 1, role
        assert [p for e in mine if e["hook"] == "register_models" for p in e["plugins"]].count("models") == 1, role
        assert hooks.index("platform_resolved") < hooks.index("register_models"), role
        if role.startswith("worker"):
            assert hooks.count("register_triton_kernel_overrides") == 1
            assert hooks.count("get_attn_backend_cls") == 1  # one selector for every layer: asked once
            assert hooks.index("register_models") < hooks.index("register_triton_kernel_overrides") \
                < hooks.index("get_attn_backend_cls") < hooks.index("kernel_table")  # the core traces the winners
            assert "update_block_size_for_backend" not in hooks  # chosen once, in the front end
        else:
            assert "get_attn_backend_cls" not in hooks  # only workers build models
    from kernelcore.entrypoints.plugins_cmd import render_tour

    tour = render_tour(str(trace))
    for role in ("frontend", "engine-core", "worker-0", "worker-1"):
        assert role in tour
    assert "register_triton_kernel_overrides" in tour


def test_a_worker_that_fails_to_start_is_a_clear_error_and_leaves_no_process(llama_dir):
    proc = run_python(f"""
        import psutil
        from kernelcore.config_builder import build_config
        from kernelcore.engine.core import EngineCore
        from kernelcore.hostproc import ProcessStartError
        if __name__ == "__main__":
            config = build_config(model={llama_dir!r}, tensor_parallel_size=2, kv_cache_memory=1 << 24)
            config.parallel.worker_cls = "no_such_vendor.worker.Worker"
            try:
                EngineCore(config)
            except ProcessStartError as exc:
                print("ERROR:", exc)
            left = [p for p in psutil.Process().children(recursive=True) if "kc::" in " ".join(p.cmdline())]
            print("LEFT:", len(left))
    """)
    assert "ERROR: process worker-" in proc.stdout and "no_such_vendor" in proc.stdout
    assert "LEFT: 0" in proc.stdout
