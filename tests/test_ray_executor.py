"""The ``ray`` executor on a local Ray cluster the test starts (loopback, 2 CPUs): TP=2 equals TP=1, and a
cluster too small for the ranks is a clear error."""

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import clean_env, free_port, run_python
from test_multinode import greedy_script

try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - CI installs kernelcore[ray]
    pytest.skip(f"Ray is not installed ({exc}); pip install 'kernelcore[ray]'", allow_module_level=True)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    port = free_port()
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = str(tmp_path_factory.mktemp("ray"))
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp_dir}"], env=clean_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    address = f"127.0.0.1:{port}"
    try:
        for line in head.stdout:  # event: the head says it is up
            if "Ray runtime started" in line:
                break
        else:
            pytest.fail("ray start --head exited before the runtime started")
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the cluster this test started, and only it
        try:
            head.wait(5)  # (a graceful stop takes Ray about 30 s; every one of its processes is in this group)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(30)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)


@pytest.mark.slow
def test_tp2_through_the_ray_executor_equals_tp1(ray_cluster, llama_dir):
    reference = json.loads(run_python(greedy_script(llama_dir, "tensor_parallel_size=1")).stdout.splitlines()[-1])
    out = run_python(greedy_script(llama_dir, "tensor_parallel_size=2, distributed_executor_backend='ray'"),
                     RAY_ADDRESS=ray_cluster, timeout=600)
    tokens, logprobs = json.loads(out.stdout.strip().splitlines()[-1])
    assert tokens == reference[0]
    for rid in logprobs:
        for a, b in zip(logprobs[rid], reference[1][rid], strict=False):
            assert a == pytest.approx(b, abs=2e-4)
    too_big = run_python(greedy_script(llama_dir, "tensor_parallel_size=4, distributed_executor_backend='ray'"),
                         RAY_ADDRESS=ray_cluster, check=False, timeout=600)
    assert too_big.returncode != 0
    assert "the Ray cluster lacks the resources for 4 workers of {'CPU': 1.0}" in too_big.stderr
