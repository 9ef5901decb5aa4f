"""Data parallelism across two simulated hosts (network namespaces): the head's front end balances over its own
engine core and one on the other host (``kc serve --headless -dpr 1``), answers like DP=1, keeps prefix affinity,
and drops the remote replica when it dies or its link goes down, carrying its requests to the local one."""

import json
import time

import netns
import psutil
import pytest
from helpers import run_python
from test_data_parallel import check_dp2_like_dp1, dp_script, metric

pytestmark = [pytest.mark.skipif(netns.skip_reason() is not None, reason=str(netns.skip_reason())),
              pytest.mark.slow]  # starts hosts in network namespaces

SECRET = "dp-cluster-secret"
PORT = "29571"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)


@pytest.fixture
def hosts():
    with netns.two_hosts() as h:
        h.started = []
        yield h
        for proc in h.started:
            netns.kill_tree(proc)


def head_args(hosts) -> str:
    return (f"data_parallel_size=2, data_parallel_size_local=1, data_parallel_address={hosts.addrs[0]!r}, "
            f"data_parallel_rpc_port={PORT}, cluster_secret={SECRET!r}")


def remote_replica(hosts, model_dir: str, secret: str = SECRET):
    return hosts.kc(1, "serve", model_dir, "-dp", "2", "-dpl", "1", "-dpr", "1", "-dpa", hosts.addrs[0], "-dpp", PORT,
                    "--kv-cache-memory", "16MiB", "--headless", KC_CLUSTER_SECRET=secret)



@pytest.mark.slow
def test_dp2_across_two_hosts_answers_like_dp1_with_prefix_affinity(llama_dir, hosts):
    single = json.loads(run_python(dp_script(llama_dir, "data_parallel_size=1"), timeout=600)
                        .stdout.strip().splitlines()[-1])
    node = remote_replica(hosts, llama_dir)
    head = hosts.python(0, dp_script(llama_dir, head_args(hosts)))
    hosts.started += [node, head]
    out, err = head.communicate(timeout=600)
    assert head.returncode == 0, err[-4000:]
    double = json.loads(out.strip().splitlines()[-1])
    check_dp2_like_dp1(single, double)  # replica 1 is the other host's engine core
    assert node.wait(60) == 0, node.stderr.read()[-4000:]  # the head's shutdown ends the remote replica cleanly


def test_a_wrong_secret_keeps_the_remote_replica_out(llama_dir, hosts):
    node = remote_replica(hosts, llama_dir, secret="not-the-secret")
    head = hosts.python(0, dp_script(llama_dir, head_args(hosts)), KC_READY_TIMEOUT="120")
    hosts.started += [node, head]
    _, node_err = node.communicate(timeout=300)
    assert node.returncode == 1 and f"the master at {hosts.addrs[0]}:{PORT} refused this host: bad cluster secret" \
        in node_err, node_err[-4000:]
    netns.kill_tree(head)
    assert f"refused cluster connection from {hosts.addrs[1]}" in head.stderr.read()


SERVE_UNTIL_DROPPED = """
import asyncio, json
from kernelcore.config_builder import build_config
from kernelcore.engine.async_llm import AsyncLLM
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.metrics.prometheus import PrometheusStatLogger

async def main():
    config = build_config(model=MODEL, kv_cache_memory=1 << 24, ARGS)
    prom = PrometheusStatLogger(config)
    llm = await AsyncLLM.create(config, stat_loggers=[prom])
    import psutil
    print(json.dumps({"children": [p.pid for p in psutil.Process().children(recursive=True)
                                   if "kc::" in " ".join(p.cmdline())]}), flush=True)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs, seen, started = [], set(), asyncio.Event()

    async def one(rid):
        async for out in llm.generate(rid, [5, 6, 7], params):  # shorter than a block: routed by load only
            seen.add(llm.replica_of.get(rid))
        return out.outputs[0].token_ids

    reference = await one("reference")

    async def keep_generating(loop_id):
        i = 0
        while not llm.lost_replicas:  # one request on each replica at a time, until one replica is lost
            outputs.append(await one(f"{loop_id}-{i}"))
            i += 1
            if seen >= {0, 1}:
                started.set()

    tasks = [asyncio.create_task(keep_generating(n)) for n in range(2)]
    await started.wait()
    print("GENERATING", flush=True)
    while not llm.lost_replicas:
        await asyncio.sleep(0.05)
    print(json.dumps({"lost": list(llm.lost_replicas.values())}), flush=True)
    await asyncio.gather(*tasks)  # the lost replica's request went on on replica 0: none fails
    after = await asyncio.gather(*(one(f"after-{i}") for i in range(3)))
    metrics = prom.generate_latest().decode()
    result = {"same": all(o == reference for o in outputs + after), "num": len(outputs), "is_dead": llm.is_dead,
              "lost": llm.lost_replicas, "metrics": metrics}
    await llm.shutdown()
    print(json.dumps(result), flush=True)

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["kill-remote-core", "link-down"])
def test_a_lost_remote_replica_is_dropped_and_its_requests_go_on_locally(failure, llama_dir, hosts):
    node = remote_replica(hosts, llama_dir)
    head = hosts.python(0, SERVE_UNTIL_DROPPED.replace("MODEL", repr(llama_dir)).replace("ARGS", head_args(hosts)))
    hosts.started += [node, head]
    head_children = json.loads(head.stdout.readline())["children"]
    assert head.stdout.readline().strip() == "GENERATING"
    node_children = netns.kc_family(node)
    assert len(head_children) == 1 and len(node_children) == 1  # one engine core (TP=1: worker inside) per host
    started = time.monotonic()
    if failure == "kill-remote-core":
        psutil.Process(node_children[0]).kill()
    else:
        hosts.run(1, "ip", "link", "set", hosts.interfaces[1], "down")
    lost = json.loads(head.stdout.readline())["lost"]
    detected = time.monotonic() - started
    assert lost and f"data-parallel replica 1 ({hosts.addrs[1]}) lost" in lost[0], lost
    assert detected < 20, f"the front end took {detected:.0f}s to notice"  # the bound
    out, err = head.communicate(timeout=300)
    assert head.returncode == 0, err[-4000:]  # no request failed
    result = json.loads(out.strip().splitlines()[-1])
    assert not result["is_dead"] and result["same"], result["num"]  # greedy: each equals the undisturbed answer
    assert list(result["lost"]) == ["1"]
    assert metric(result["metrics"], "kc:dp_replica_up", replica="1") == 0
    assert metric(result["metrics"], "kc:dp_replica_up", replica="0") == 1
    # the request in flight there when it was lost (each loop waits for its request: one was on replica 1)
    assert metric(result["metrics"], "kc:dp_requests_resubmitted_total", replica="1") == 1
    assert node.wait(60) == 1  # its engine core died, or lost the head
    assert not netns.alive(head_children + node_children + [node.pid])
