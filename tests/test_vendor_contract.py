"""What a vendor's out-of-tree package relies on, through the pip-installed dummy packages: the block size and
dtype a platform chooses, kernel overrides on forward_oot, one-line plugin errors, hook typos, plugin loggers,
and endpoint plugins enabled apart from the KC_PLUGINS allow-list."""

import json

import pytest
from helpers import run_kc, run_python

pytestmark = pytest.mark.slow  # starts servers and engines on the vendor's dummy platform

GENERATE = """
    import json, torch
    from transformers import AutoModelForCausalLM
    from kernelcore import LLM, SamplingParams
    llm = LLM({path!r}, kv_cache_memory=4 << 20, max_num_batched_tokens=64, tensor_parallel_size={tp}, **{kwargs})
    prompt = list(range(3, 50))  # 47 tokens: two blocks of 32, three of 16
    out = llm.generate([{{"prompt_token_ids": prompt}}], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained({path!r}).eval()
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    core = llm.engine_core
    result = dict(same=out == ref[0, len(prompt):].tolist(), core=core.block_size, kv=core.scheduler.kv.block_size,
                  config=llm.config.cache.block_size)
    worker = getattr(core.executor, "worker", None)
    if worker is not None:
        from kc_dummy_platform.kernels import launches
        runner = worker.model_runner
        result.update(runner=runner.block_size, cache_shape=list(runner.kv_caches[0].shape), launches=dict(launches),
                      ops={{type(m).__name__: m.forward_method_name for m in runner.model.modules()
                            if hasattr(m, "forward_method_name")}})
    llm.shutdown()
    print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("vendor") / "llama"))


def _generate(path, tp=1, kwargs=None, **env):
    proc = run_python(GENERATE.format(path=path, tp=tp, kwargs=kwargs or {}), KC_DUMMY_DEVICE="1", **env)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_platform_block_size_and_kernel_overrides_reach_kv_manager_and_worker(llama, tmp_path):
    trace = tmp_path / "trace.jsonl"
    result, _ = _generate(llama, KC_DUMMY_BLOCK_SIZE="32", KC_TRACE_PLUGINS=str(trace))
    assert result["same"]
    assert result["core"] == result["kv"] == result["config"] == result["runner"] == 32
    assert result["cache_shape"][3] == 32  # the CPU backend's layout: (2, blocks, kv heads, block size, head size)
    # The platform's kernel overrides run on forward_oot (no op class of its own for these), and the core traces them.
    assert {"rms_norm", "fused_add_rms_norm", "silu_and_mul"} <= set(result["launches"])
    assert result["ops"]["RMSNorm"] == "forward_oot" and result["ops"]["SiluAndMul"] == "forward_oot"
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    tables = [e for e in events if e["hook"] == "kernel_table"]
    assert len(tables) == 1, "the core emits one kernel_table event per worker"
    assert tables[0]["result"]["rms_norm"] == "dummy_platform:dummy_rms_norm"
    assert tables[0]["result"]["rotary_embedding"].startswith("triton_kernels:")  # not overridden: native rotary


def test_user_block_size_is_kept(llama):
    result, _ = _generate(llama, kwargs={"block_size": 16}, KC_DUMMY_BLOCK_SIZE="32")
    assert result["same"] and result["core"] == result["runner"] == 16


@pytest.mark.slow
def test_platform_block_size_reaches_every_worker_at_tp2(llama):
    result, stderr = _generate(llama, tp=2, KC_DUMMY_BLOCK_SIZE="32")
    assert result["same"] and result["core"] == result["kv"] == result["config"] == 32
    for rank in (0, 1):  # the vendor's own logger (kc_dummy_platform), from each worker process
        assert f"DummyWorker rank {rank}: KV block size 32" in stderr


DTYPES = """
    import json, sys
    sys.path.insert(0, "tests")
    from kernelcore.config_builder import build_config
    from conftest_models import make_llama_checkpoint
    path = make_llama_checkpoint({path!r})
    default, chosen = build_config(model=path), build_config(model=path, dtype="float32")
    print(json.dumps([default.model.dtype, default.is_user_set("model.dtype"), chosen.model.dtype,
                      chosen.is_user_set("model.dtype"), default.is_user_set("cache.block_size")]))
"""


def test_platform_chooses_the_default_dtype_and_the_users_choice_stays(tmp_path):
    code = DTYPES.format(path=str(tmp_path / "m"))
    out = run_python(code, KC_DUMMY_DEVICE="1", KC_DUMMY_DTYPE="bfloat16").stdout
    assert json.loads(out.splitlines()[-1]) == ["bfloat16", False, "float32", True, False]
    out = run_python(code).stdout  # the CPU platform: float32 unless asked
    assert json.loads(out.splitlines()[-1])[0] == "float32"


def test_validate_environ_refusal_is_one_line_naming_plugin_distribution_and_hook():
    proc = run_kc("serve", "--port", "0", check=False, KC_DUMMY_DEVICE="1", KC_DUMMY_DRIVER="missing")
    assert proc.returncode == 1
    assert ("Error: platform plugin 'dummy_platform' (distribution kc-dummy-platform) failed in validate_environ: "
            "RuntimeError: the DummyDevice driver is not installed (KC_DUMMY_DRIVER=missing)") in proc.stderr
    assert "Traceback" not in proc.stderr
    debug = run_kc("serve", "--port", "0", check=False, KC_DUMMY_DEVICE="1", KC_DUMMY_DRIVER="missing",
                   KC_LOG_LEVEL="DEBUG")
    assert "Traceback" in debug.stderr  # the traceback is kept at debug level


def test_misspelled_hook_is_an_error_for_that_plugin_with_a_suggestion():
    report = json.loads(run_kc("plugins", "--json", KC_DUMMY_TYPO_HOOK="1").stdout)
    record = next(r for r in report["plugins"] if r["name"] == "dummy_typo")
    assert record["status"] == "failed"
    assert "unknown hook 'register_model'; did you mean 'register_models'?" in record["error"]
    proc = run_python("from kernelcore import platforms, plugins; platforms.load_general_plugins()", check=False,
                      KC_DUMMY_TYPO_HOOK="1")
    assert proc.returncode != 0
    assert "plugin 'dummy_typo' (distribution kc-dummy-model): unknown hook 'register_model'" in proc.stderr


def test_allow_list_that_excludes_an_installed_platform_warns():
    proc = run_kc("plugins", KC_DUMMY_DEVICE="1", KC_PLUGINS="dummy_endpoints")
    assert "excludes the installed platform plugin 'dummy_platform' (kc-dummy-platform)" in proc.stderr
    assert "=> cpu" in proc.stdout


@pytest.mark.slow
def test_endpoint_plugin_enabled_apart_from_the_allow_list_on_the_vendor_platform():
    import subprocess
    import sys

    import requests
    from helpers import clean_env
    from test_server_e2e import free_port

    port = free_port()
    env = clean_env(KC_DUMMY_DEVICE="1", KC_ENDPOINT_PLUGINS="dummy_endpoints", KC_DUMMY_BLOCK_SIZE="32")
    proc = subprocess.Popen([sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", "--port", str(port),
                             "--kv-cache-memory", "8MiB"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    try:
        for line in proc.stdout:  # wait on the server's own "Serving" line, not on a clock
            lines.append(line)
            if "Serving" in line:
                break
        assert lines and "Serving" in lines[-1], "".join(lines)
        url = f"http://127.0.0.1:{port}"
        assert requests.get(url + "/plugins/dummy/info", timeout=60).json() == {"platform": "DummyDevice",
                                                                                 "block_size": 32}
        # A vendor's own API family on the shared request path: the chat path's answer, its own error shape.
        answer = requests.post(url + "/plugins/dummy/ask", json={"q": "hello", "max_tokens": 5}, timeout=300)
        assert answer.status_code == 200 and answer.json()["tokens"] == 5 and answer.json()["finish"] == "length"
        refused = requests.post(url + "/plugins/dummy/ask", json={"q": "hello", "max_tokens": -1}, timeout=60)
        assert refused.status_code == 400 and "max_tokens" in refused.json()["problem"]
        body = {"prompt": "hello world", "max_tokens": 40, "temperature": 0}
        reply = requests.post(url + "/v1/completions", json=body, timeout=300)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=60)[0]
    log = "".join(lines) + rest
    assert "Endpoint plugin 'dummy_endpoints' registered its routes" in log
    assert "DummyWorker rank 0: KV block size 32" in log  # a plugin logger's line reaches the server log


def test_a_forked_child_has_the_platform_registered_with_its_own_plugin_manager():
    out = run_python("""
        import json, os
        from kernelcore import platforms, plugins
        from kernelcore.attention import AttentionSelector
        from kernelcore.platforms import current_platform
        platforms.load_general_plugins()
        parent = id(current_platform)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            import kernelcore.platforms as p
            platforms.load_general_plugins()
            selector = AttentionSelector(64, 4, 2, "float32", 16)
            answer = plugins.get_plugin_manager().hook.get_attn_backend_cls(selector=selector)
            os.write(write, json.dumps([p.current_platform.device_name, id(p.current_platform) != parent,
                                        answer]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(read, 4096).decode())
    """, KC_DUMMY_DEVICE="1").stdout
    assert json.loads(out.strip().splitlines()[-1]) == ["DummyDevice", True,
                                                        "kc_dummy_platform.attention.DummyAttentionBackend"]
