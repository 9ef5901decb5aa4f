"""A bad LoRA adapter is refused when it is added, and an adapter that stops loading later fails only the
requests that use it: co-batched requests finish with all their tokens, at TP=1 and TP=2, and the engine
keeps serving (a genuinely dead worker still kills it)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from conftest_models import make_llama_checkpoint
from helpers import run_python
from lora_helpers import make_bad_shape_adapter, make_peft_adapter, make_pickle_payload_adapter
from safetensors.torch import load_file, save_file


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-isolation")
    base = make_llama_checkpoint(str(root / "base"))
    good = make_peft_adapter(base, str(root / "good"), "llama", seed=3, rank=8)
    return {"root": root, "base": base, "good": good,
            "bad": make_bad_shape_adapter(good, str(root / "bad-shape"), "k_proj", "B"),
            "bad_a": make_bad_shape_adapter(good, str(root / "bad-shape-a"), "o_proj", "A")}


def _variant(good: str, path: str, change) -> str:
    """A copy of ``good`` whose first lora_A tensor is ``change(tensor)``."""
    shutil.copytree(good, path)
    file = os.path.join(path, "adapter_model.safetensors")
    state = load_file(file)
    key = next(k for k in state if "lora_A" in k)
    state[key] = change(state[key])
    save_file(state, file)
    return path


def test_load_adapter_refuses_bad_tensors_with_path_free_messages(dirs, tmp_path):
    from kernelcore.lora.adapter import LoRAAdapterError, load_adapter

    def nan(t):
        t = t.clone()
        t[0, 0] = float("nan")
        return t

    cases = {"NaN or infinite": _variant(dirs["good"], str(tmp_path / "nan"), nan),
             "dtype int32": _variant(dirs["good"], str(tmp_path / "int"), lambda t: t.to(torch.int32)),
             "rank r=8": _variant(dirs["good"], str(tmp_path / "rank"), lambda t: t[:4].contiguous()),
             "3 dimensions": _variant(dirs["good"], str(tmp_path / "3d"), lambda t: t[None].contiguous())}
    for message, path in cases.items():
        with pytest.raises(LoRAAdapterError, match=message) as info:
            load_adapter(path, 8)
        assert str(tmp_path) not in str(info.value)
    assert load_adapter(dirs["good"], 8).rank == 8


def test_a_pickle_payload_is_refused_and_not_run(dirs, tmp_path):
    from kernelcore.lora.adapter import LoRAAdapterError, load_adapter

    control = tmp_path / "control-marker"
    make_pickle_payload_adapter(dirs["good"], str(tmp_path / "control"), str(control))
    torch.load(tmp_path / "control" / "adapter_model.bin", weights_only=False)
    assert control.exists()  # the payload is real: unpickling it runs code

    marker = tmp_path / "marker"
    path = make_pickle_payload_adapter(dirs["good"], str(tmp_path / "payload"), str(marker))
    with pytest.raises(LoRAAdapterError, match="adapter_model.bin is not a plain tensor file.*refused") as info:
        load_adapter(path, 8)
    assert not marker.exists()
    assert str(tmp_path) not in str(info.value)


ENGINE_SCRIPT = """
import json, os, shutil, signal
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.errors import RequestStateError
if __name__ == "__main__":
    core = EngineCore(build_config(model=BASE, tensor_parallel_size=TP, kv_cache_memory=1 << 24, enable_lora=True,
                                   max_loras=2, max_cpu_loras=1, max_lora_rank=8, max_num_batched_tokens=256))
    out = {"refused": {}}
    for name, path in (("bad-shape", BAD), ("bad-shape-a", BAD_A), ("pickle", PICKLE)):
        try:
            core.add_lora(9, name, path)
        except RequestStateError as exc:
            out["refused"][name] = str(exc)
    shutil.copytree(GOOD, SWAP)
    core.add_lora(1, "swapped", SWAP)
    core.add_lora(2, "good", GOOD)  # the workers' CPU cache holds one adapter: "swapped" is read again when used
    shutil.rmtree(SWAP)
    shutil.copytree(BAD, SWAP)  # its files change on disk after it was added

    def run(requests):
        for rid, lora_id in requests:
            core.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=PROMPT, lora_id=lora_id,
                             sampling_params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
        tokens, errors, steps = {}, {}, []
        while core.has_unfinished_requests():
            step = core.step()
            errors.update(step.errors)
            steps.append([sorted(o.request_id for o in step.outputs), sorted(step.errors)])
            for o in step.outputs:
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        return {"tokens": tokens, "errors": errors, "first_step": steps[0]}

    out["mixed"] = run([("base-0", 0), ("swapped", 1), ("base-1", 0), ("good", 2)])
    shutil.rmtree(SWAP)
    shutil.copytree(GOOD, SWAP)  # fixed again: the same adapter id loads and serves
    out["after"] = run([("base-2", 0), ("swapped-again", 1)])
    if TP > 1:
        from kernelcore.executor.base import WorkerDiedError
        os.kill(core.executor.workers[1].process.pid, signal.SIGKILL)
        core.executor.workers[1].process.join(30)
        try:
            run([("after-death", 0)])
        except WorkerDiedError as exc:
            out["dead"] = str(exc)
    core.shutdown()
    print(json.dumps(out))
"""


@pytest.mark.slow  # spawns engines and TP workers
@pytest.mark.parametrize("tp", [1, 2])
def test_bad_adapter_fails_alone_and_the_engine_keeps_serving(dirs, tmp_path, tp):
    marker = tmp_path / "marker"
    values = {"BASE": dirs["base"], "TP": tp, "GOOD": dirs["good"], "BAD": dirs["bad"], "BAD_A": dirs["bad_a"],
              "PICKLE": make_pickle_payload_adapter(dirs["good"], str(tmp_path / "pickle"), str(marker)),
              "SWAP": str(tmp_path / "swap"), "PROMPT": [5, 9, 14, 3, 7, 11, 2, 8, 40, 41]}
    script = ENGINE_SCRIPT
    for key in sorted(values, key=len, reverse=True):  # BAD_A before BAD
        script = script.replace(key, repr(values[key]))
    out = json.loads(run_python(script, timeout=600).stdout.strip().splitlines()[-1])

    refused = out["refused"]
    assert set(refused) == {"bad-shape", "bad-shape-a", "pickle"}
    assert ("k_proj" in refused["bad-shape"]
            and "lora_B has shape (64, 8), the model needs (32, 8)" in refused["bad-shape"])
    assert ("o_proj" in refused["bad-shape-a"]
            and "lora_A has shape (8, 128), the model needs (8, 64)" in refused["bad-shape-a"])
    assert "adapter_model.bin" in refused["pickle"] and not marker.exists()
    assert not any(str(dirs["root"]) in m or str(tmp_path) in m for m in refused.values())

    mixed = out["mixed"]
    assert mixed["first_step"] == [["base-0", "base-1", "good"], ["swapped"]]  # one batch: the others ran alongside
    assert list(mixed["errors"]) == ["swapped"]
    assert "LoRA adapter 'swapped' cannot be used" in mixed["errors"]["swapped"]
    assert "k_proj" in mixed["errors"]["swapped"] and str(tmp_path) not in mixed["errors"]["swapped"]
    assert sorted(mixed["tokens"]) == ["base-0", "base-1", "good"]
    assert all(len(t) == 8 for t in mixed["tokens"].values())
    after = out["after"]
    assert not after["errors"]
    assert mixed["tokens"]["base-0"] == mixed["tokens"]["base-1"] == after["tokens"]["base-2"]  # undisturbed
    assert after["tokens"]["swapped-again"] == mixed["tokens"]["good"]  # the same weights, loaded again
    assert after["tokens"]["swapped-again"] != after["tokens"]["base-2"]
    if tp > 1:
        assert "worker-1" in out["dead"]


def test_scheduler_fails_left_out_requests_alone_and_frees_their_blocks():
    from kernelcore.config import KernelConfig, LoraConfig, ModelConfig
    from kernelcore.core_types.runner_output import ModelRunnerOutput
    from kernelcore.core_types.sampling_params import SamplingParams
    from kernelcore.engine.request import EngineCoreRequest
    from kernelcore.engine.scheduler import Scheduler

    config = KernelConfig(model=ModelConfig(max_model_len=256), lora=LoraConfig(enable_lora=True, max_loras=2))
    scheduler = Scheduler(config, num_blocks=64, block_size=16)
    scheduler.lora_names[1] = "broken"
    for rid, lora_id in (("base", 0), ("lora", 1), ("grammar", 0)):
        scheduler.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=[5, 6, 7, 8], lora_id=lora_id,
                                                sampling_params=SamplingParams(max_tokens=3, ignore_eos=True)))
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens) == ["base", "lora", "grammar"]
    outputs = scheduler.update_from_output(out, ModelRunnerOutput(
        ["base"], [9], failed={"grammar": "its grammar cannot be compiled"}, failed_loras={1: "bad tensor"}))
    assert [o.request_id for o in outputs] == ["base"]
    assert scheduler.failed == {"grammar": "its grammar cannot be compiled",
                                "lora": "LoRA adapter 'broken' cannot be used: bad tensor"}
    assert list(scheduler.requests) == ["base"] and sorted(scheduler.finished_req_ids) == ["grammar", "lora"]
    assert scheduler.kv.usage > 0
    while scheduler.has_unfinished_requests():  # the survivor runs to its end
        out = scheduler.schedule()
        assert list(out.num_scheduled_tokens) == ["base"]
        outputs = scheduler.update_from_output(out, ModelRunnerOutput(["base"], [9]))
    assert outputs[-1].finish_reason == "length" and scheduler.kv.usage == 0
