"""Several hosts, simulated with network namespaces: TP across two nodes equals one process; a wrong secret,
a mismatched node, a dead node and a dead head are each reported (host and rank named) and leave no process."""

import json
import signal

import netns
import psutil
import pytest
from helpers import run_python

pytestmark = [pytest.mark.skipif(netns.skip_reason() is not None, reason=str(netns.skip_reason())),
              pytest.mark.slow]  # starts hosts in network namespaces

SECRET = "test-cluster-secret"
PORT = "29551"
PROMPTS = [[5, 9, 14, 3, 7, 11, 2, 8], [17, 4, 4, 12], list(range(30, 70))]

GREEDY = """
import json
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
if __name__ == "__main__":
    core = EngineCore(build_config(model=MODEL, kv_cache_memory=1 << 24, ARGS))
    for i, p in enumerate(PROMPTS):
        core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=p, sampling_params=SamplingParams(
            temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)))
    tokens, logprobs = {}, {}
    while core.has_unfinished_requests():
        for o in core.step().outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            logprobs.setdefault(o.request_id, []).extend(lp.logprobs for lp in o.new_logprobs or [])
    core.shutdown()
    print(json.dumps([tokens, logprobs]), flush=True)
"""


def greedy_script(model_dir: str, args: str) -> str:
    return GREEDY.replace("MODEL", repr(model_dir)).replace("ARGS", args).replace("PROMPTS", repr(PROMPTS))


def cluster_args(hosts, node_rank: int, tp: int = 2, pp: int = 1, nnodes: int = 2) -> str:
    return (f"tensor_parallel_size={tp}, pipeline_parallel_size={pp}, nnodes={nnodes}, node_rank={node_rank}, "
            f"master_addr={hosts.addrs[0]!r}, master_port={PORT}, cluster_secret={SECRET!r}")


def headless(hosts, model_dir: str, *extra: str, secret: str = SECRET, tp: int = 2, pp: int = 1, **env: str):
    return hosts.kc(1, "serve", model_dir, "-tp", str(tp), "-pp", str(pp), "--nnodes", "2", "--node-rank", "1",
                    "--master-addr", hosts.addrs[0], "--master-port", PORT, "--headless", *extra,
                    KC_CLUSTER_SECRET=secret, **env)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)


@pytest.fixture(scope="module")
def opt_dir(tmp_path_factory):
    from conftest_models import make_opt_checkpoint

    return make_opt_checkpoint(str(tmp_path_factory.mktemp("opt")))


@pytest.fixture(scope="module")
def gguf_file(llama_dir, tmp_path_factory):
    """The Llama checkpoint as a GGUF file of several block types (a fused qkv of three)."""
    from gguf_helpers import add_tokenizer, write_gguf

    add_tokenizer(llama_dir, 320)
    return write_gguf(llama_dir, str(tmp_path_factory.mktemp("gguf") / "model.gguf"), "Q8_0", override_types={
        "blk.0.attn_q.weight": "Q5_0", "blk.0.attn_k.weight": "Q4_1", "blk.1.ffn_down.weight": "Q4_0"})


@pytest.fixture
def hosts():
    with netns.two_hosts() as h:
        procs = []
        h.started = procs
        yield h
        for proc in procs:
            netns.kill_tree(proc)



@pytest.mark.parametrize("model,tp,pp", [("llama", 2, 1), ("opt", 2, 1), ("gguf", 2, 1),
                                         pytest.param("llama", 1, 2, marks=pytest.mark.slow),
                                         pytest.param("opt", 2, 2, marks=pytest.mark.slow)])
def test_parallel_across_two_hosts_matches_one_process(model, tp, pp, llama_dir, opt_dir, hosts, tmp_path, request):
    """TP=2 (a rank per host), PP=2 (a stage per host), TP=2 x PP=2 (a 2-rank stage per host); a quantized GGUF
    file with TP=2 (each host takes its rows or blocks of the stored blocks)."""
    model_dir = {"llama": llama_dir, "opt": opt_dir}.get(model) or request.getfixturevalue("gguf_file")
    # the float kernel for every GGUF type: a rank's half of a layer is another shape, which the start-up tuner may
    # give the int8-activation path where the whole layer got the float one (a larger difference than the bound)
    exact = {"KC_CPU_GGUF_INT_DOT": "none"}
    tokens_1, logprobs_1 = json.loads(run_python(greedy_script(model_dir, "tensor_parallel_size=1"), **exact)
                                      .stdout.strip().splitlines()[-1])
    trace = str(tmp_path / "trace.jsonl")  # one file both hosts append to (the namespaces share the disk)
    node = headless(hosts, model_dir, tp=tp, pp=pp, KC_TRACE_PLUGINS=trace, **exact)
    head = hosts.python(0, greedy_script(model_dir, cluster_args(hosts, 0, tp=tp, pp=pp)), KC_TRACE_PLUGINS=trace,
                        **exact)
    hosts.started += [node, head]
    out, err = head.communicate(timeout=600)
    assert head.returncode == 0, err[-4000:]
    tokens_2, logprobs_2 = json.loads(out.strip().splitlines()[-1])
    assert node.wait(60) == 0, node.stderr.read()[-4000:]  # the head's shutdown ends the headless node cleanly
    _check_trace_hosts(trace, hosts, tp * pp)
    assert tokens_1 == tokens_2 and all(len(t) == 16 for t in tokens_1.values())
    for rid in logprobs_1:
        for a, b in zip(logprobs_1[rid], logprobs_2[rid], strict=False):
            assert a == pytest.approx(b, abs=2e-4)


def _check_trace_hosts(trace: str, hosts, world_size: int) -> None:
    """The start trace shows every process's hooks with its host: the engine and the first half of the ranks on
    the head, the headless node and the other ranks on the second host."""
    roles: dict[str, set[str]] = {}
    with open(trace) as f:
        for event in map(json.loads, f):
            roles.setdefault(event["host"], set()).add(event["role"])
    half = world_size // 2
    # the head is an offline LLM: its engine core runs in the front-end process
    head_roles = {"frontend", *(f"worker-{r}" for r in range(half))}
    node_roles = {"node-1", *(f"worker-{r}" for r in range(half, world_size))}
    assert set(roles) == set(hosts.hostnames), roles
    assert head_roles <= roles[hosts.hostnames[0]] and not node_roles & roles[hosts.hostnames[0]], roles
    # `kc serve` loads the platform plugins for its CLI options before it parses --headless: those first
    # events carry the default role, "frontend"; everything after is the node's
    assert node_roles <= roles[hosts.hostnames[1]] <= node_roles | {"frontend"}, roles


def _wait_for_line(stream, needle: str, timeout: float = 120) -> list[str]:
    """Read ``stream`` until a line contains ``needle`` (a safety timeout only); returns the lines read."""
    import threading

    lines, found = [], threading.Event()

    def read():
        for line in stream:
            lines.append(line)
            if needle in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"never saw {needle!r} in:\n{''.join(lines)[-4000:]}"
    return lines


def test_a_wrong_secret_is_refused_and_logged_on_both_sides(llama_dir, hosts):
    head = hosts.python(0, greedy_script(llama_dir, cluster_args(hosts, 0)))
    node = headless(hosts, llama_dir, secret="not-the-secret")
    hosts.started += [node, head]
    _, node_err = node.communicate(timeout=300)
    assert node.returncode == 1
    assert f"node 1 (ranks [1]) cannot join: the master at {hosts.addrs[0]}:{PORT} refused this host: " \
           "bad cluster secret" in node_err
    _wait_for_line(head.stderr, f"refused cluster connection from {hosts.addrs[1]}")
    netns.kill_tree(head)


def test_a_node_with_other_parallel_sizes_fails_the_start_naming_host_and_setting(llama_dir, hosts):
    head = hosts.python(0, greedy_script(llama_dir, cluster_args(hosts, 0)))
    node = headless(hosts, llama_dir, tp=4)
    hosts.started += [node, head]
    _, node_err = node.communicate(timeout=300)
    _, head_err = head.communicate(timeout=300)
    expected = f"node 1 ({hosts.addrs[1]}) cannot join the head at {hosts.addrs[0]}:{PORT}: tensor_parallel_size " \
               f"is '4' on node 1 ({hosts.addrs[1]}) but '2' on the head"
    assert node.returncode == 1 and expected in node_err
    assert head.returncode != 0 and expected in head_err and "ProcessStartError" in head_err


def test_an_unreachable_master_is_a_clear_error(llama_dir, hosts):
    node = headless(hosts, llama_dir, KC_READY_TIMEOUT="3")
    hosts.started.append(node)
    _, err = node.communicate(timeout=300)
    assert node.returncode == 1
    assert f"node 1 (ranks [1]) cannot join: cannot reach the master at {hosts.addrs[0]}:{PORT}" in err


SERVE_UNTIL_DEAD = """
import asyncio, json, time
from kernelcore.config_builder import build_config
from kernelcore.engine.async_llm import AsyncLLM, EngineDeadError
from kernelcore.core_types.sampling_params import SamplingParams

async def main():
    llm = await AsyncLLM.create(build_config(model=MODEL, kv_cache_memory=1 << 24, ARGS))
    import psutil
    children = [p.pid for p in psutil.Process().children(recursive=True) if "kc::" in " ".join(p.cmdline())]
    print(json.dumps({"children": children}), flush=True)
    params, i = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), 0
    try:
        while True:
            async for _ in llm.generate(str(i), [5, 6, 7], params):
                pass
            if i == 0:
                print("GENERATING", flush=True)
            i += 1
    except EngineDeadError as exc:
        result = str(exc)
    print(json.dumps({"dead": result, "is_dead": llm.is_dead, "served": i}), flush=True)
    await llm.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
"""


def _start_serving(hosts, model_dir):
    node = headless(hosts, model_dir)
    head = hosts.python(0, SERVE_UNTIL_DEAD.replace("MODEL", repr(model_dir)).replace("ARGS", cluster_args(hosts, 0)))
    hosts.started += [node, head]
    head_children = json.loads(head.stdout.readline())["children"]
    assert head.stdout.readline().strip() == "GENERATING"
    return head, node, head_children, netns.kc_family(node)


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["kill-remote-worker", "link-down"])
def test_losing_the_worker_node_kills_the_engine_and_leaves_no_process(failure, llama_dir, hosts):
    import time

    head, node, head_children, node_children = _start_serving(hosts, llama_dir)
    assert len(head_children) == 2 and len(node_children) == 1  # engine-core + worker-0 | worker-1
    started = time.monotonic()
    if failure == "kill-remote-worker":
        psutil.Process(node_children[0]).send_signal(signal.SIGKILL)
    else:
        hosts.run(1, "ip", "link", "set", hosts.interfaces[1], "down")
    result = json.loads(head.stdout.readline())
    detected = time.monotonic() - started
    assert result["is_dead"] and result["served"] >= 1
    assert "worker-1" in result["dead"] or f"node 1 ({hosts.addrs[1]}) lost" in result["dead"], result
    assert detected < 20, f"the engine took {detected:.0f}s to notice"  # the bound (10 s heartbeat)
    assert head.wait(60) == 0
    assert node.wait(60) == 1  # its worker died, or the head fell silent
    assert not netns.alive(head_children + node_children + [node.pid])


@pytest.mark.slow
def test_a_headless_node_exits_when_the_head_dies(llama_dir, hosts):
    head, node, head_children, node_children = _start_serving(hosts, llama_dir)
    netns.kill_tree(head)
    assert node.wait(60) == 1
    err = node.stderr.read()
    assert f"the head at {hosts.addrs[0]}:{PORT} is gone" in err
    assert not netns.alive(head_children + node_children)
