"""Data parallelism: D engine cores behind one front end, requests balanced by load with prefix affinity."""

import json

import pytest
from helpers import run_python

pytestmark = pytest.mark.slow  # starts two engine cores


def test_router_balances_load_and_prefers_the_replica_holding_the_prefix():
    from kernelcore.engine.dp_router import DPRouter

    router = DPRouter(2, block_size=4)
    a, b = list(range(1, 13)), list(range(50, 62))
    first = [router.choose(a), router.choose(b)]
    assert sorted(first) == [0, 1]  # load: one each
    assert router.choose(a + [99]) == first[0]  # a's prefix lives there: affinity within the slack
    assert router.choose(b[:8] + [7, 7, 7, 7]) == first[1]  # a shorter shared prefix still counts
    assert router.choose([3, 3]) in (0, 1)  # shorter than a block: load only
    router.load[first[0]] = router.load[first[1]] + router.slack  # busier, but within the slack: affinity
    assert router.choose(a) == first[0]
    router.load[first[0]] = router.load[first[1]] + router.slack + 1  # beyond it: load wins
    assert router.choose(a) == first[1]
    router.finished(first[0])
    assert router.load[first[0]] >= 0


SCRIPT = """
import asyncio, json
from kernelcore.config_builder import build_config
from kernelcore.engine.async_llm import AsyncLLM
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.metrics.prometheus import PrometheusStatLogger

PREFIXES = [[7 + i] * 3 + list(range(20 * i, 20 * i + 29)) for i in range(4)]  # 32 tokens: two 16-token blocks

async def main():
    config = build_config(model=MODEL, kv_cache_memory=1 << 24, ARGS)
    prom = PrometheusStatLogger(config)
    llm = await AsyncLLM.create(config, stat_loggers=[prom])
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    replicas, tokens = {}, {}

    async def one(rid, prompt):
        gen = llm.generate(rid, prompt, params)
        first = await gen.__anext__()
        replicas[rid] = llm.replica_of.get(rid, 0)
        last = first
        async for last in gen:
            pass
        tokens[rid] = last.outputs[0].token_ids

    for round_ in range(2):  # the second round shares each first-round prompt's prefix
        await asyncio.gather(*(one(f"{round_}-{i}", p + [100 + round_] * 4) for i, p in enumerate(PREFIXES)))
    metrics = prom.generate_latest().decode()
    await llm.shutdown()
    print(json.dumps({"tokens": tokens, "replicas": replicas, "metrics": metrics}))

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from conftest_models import make_llama_checkpoint

    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)


def dp_script(model_dir: str, args: str) -> str:
    return SCRIPT.replace("MODEL", repr(model_dir)).replace("ARGS", args)


def _run(llama_dir, dp):
    out = run_python(dp_script(llama_dir, f"data_parallel_size={dp}"), timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_dp2_answers_everything_like_dp1_and_routes_shared_prefixes_together(llama_dir):
    check_dp2_like_dp1(_run(llama_dir, 1), _run(llama_dir, 2))


def check_dp2_like_dp1(single: dict, double: dict) -> None:
    assert double["tokens"] == single["tokens"] and len(double["tokens"]) == 8
    replicas, metrics = double["replicas"], double["metrics"]
    assert sorted(replicas[f"0-{i}"] for i in range(4)) == [0, 0, 1, 1]  # first round: balanced by load
    assert all(replicas[f"1-{i}"] == replicas[f"0-{i}"] for i in range(4))  # second: each follows its prefix
    assert metric(metrics, "kc:dp_routed_requests_total", reason="prefix") == 4
    assert metric(metrics, "kc:dp_routed_requests_total", reason="load") == 4
    for replica in ("0", "1"):  # both replicas served and each reused its cached prefixes
        assert metric(metrics, "kc:dp_prefix_cache_hits_total", replica=replica) >= 2 * 32
