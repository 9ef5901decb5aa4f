"""The conformance checks of one platform plugin. Each returns a detail string or raises AssertionError."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

DETECT = """
import importlib.metadata as md, json, os, sys, time
ep = next(e for e in md.entry_points(group="kernelcore.platform_plugins") if e.name == {name!r})
env_before, modules_before = dict(os.environ), set(sys.modules)
started = time.perf_counter()
plugin = ep.load()
first = plugin.detect_platform()
second = plugin.detect_platform()
elapsed = time.perf_counter() - started
heavy = sorted(m for m in set(sys.modules) - modules_before if m.split(".")[0] in ("torch", "triton", "transformers"))
changed = sorted(k for k in set(env_before) | set(os.environ) if env_before.get(k) != os.environ.get(k))
print(json.dumps(dict(first=first, second=second, seconds=elapsed, heavy=heavy[:5], env=changed)))
"""

GREEDY = """
import json
from kernelcore import LLM, SamplingParams
llm = LLM({model!r}, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=64)
params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
outs = llm.generate([{{"prompt_token_ids": p}} for p in {prompts!r}], params, use_tqdm=False)
print(json.dumps([o.outputs[0].token_ids for o in outs]))
llm.shutdown()
"""
PROMPTS = [[1, 5, 9, 13, 20, 7], list(range(3, 40))]


def _python(code: str, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip().splitlines()[-1]


def detection_is_cheap(name: str) -> str:
    result = json.loads(_python(DETECT.format(name=name)))
    if result["heavy"]:
        raise AssertionError(f"detection imported {result['heavy']}: import heavy modules in the Platform class")
    if result["env"]:
        raise AssertionError(f"detection changed environment variables {result['env']}")
    if result["first"] != result["second"]:
        raise AssertionError(f"detect_platform answered {result['first']!r}, then {result['second']!r}")
    if result["first"] is None:
        raise AssertionError("detect_platform returned None here: is the device present?")
    return f"returns {result['first']}, {result['seconds'] * 1000:.1f} ms, no torch import, environment untouched"


def _hook(platform: Any, name: str):
    method = getattr(type(platform), name, None)
    return getattr(platform, name) if method is not None and hasattr(method, "kernelcore_impl") else None


def _platform_config(platform: Any):
    from kernelcore.contract.config import KernelConfig

    config = KernelConfig(device_type=platform.device_type, platform_plugin=platform.plugin_name)
    for name in ("apply_config_platform_defaults", "check_and_update_config", "update_block_size_for_backend"):
        hook = _hook(platform, name)
        if hook is not None:
            hook(config=config)
    return config


def hooks_are_idempotent(platform: Any) -> str:
    import click

    command = click.Command("serve")
    hook = _hook(platform, "pre_register_and_update")
    if hook is not None:
        for parser in (command, command, None):
            hook(parser=parser)
    names = [p.name for p in command.params]
    if len(names) != len(set(names)):
        raise AssertionError(f"pre_register_and_update called twice added options twice: {names}")
    once = _platform_config(platform)
    twice = copy.deepcopy(once)
    for name in ("apply_config_platform_defaults", "check_and_update_config", "update_block_size_for_backend"):
        if _hook(platform, name) is not None:
            _hook(platform, name)(config=twice)
    if dataclasses.asdict(once) != dataclasses.asdict(twice):
        raise AssertionError("the config hooks change the config again when called a second time")
    return f"pre_register_and_update twice adds {names or 'no options'} once; config hooks are idempotent"


def named_classes_resolve(platform: Any, block_size: int) -> tuple[str, type | None]:
    from kernelcore.attention import AttentionBackend, AttentionSelector
    from kernelcore.distributed import Communicator
    from kernelcore.executor.worker import WorkerBase
    from kernelcore.platforms import resolve_obj_by_qualname

    config = _platform_config(platform)
    checks: list[tuple[str, Any, type]] = [("worker_cls", config.parallel.worker_cls, WorkerBase)]
    selector = AttentionSelector(head_size=64, num_heads=4, num_kv_heads=2, dtype="float32", block_size=block_size)
    if _hook(platform, "get_attn_backend_cls") is not None:
        checks.append(("get_attn_backend_cls", platform.get_attn_backend_cls(selector=selector), AttentionBackend))
    if _hook(platform, "get_device_communicator_cls") is not None:
        checks.append(("get_device_communicator_cls", platform.get_device_communicator_cls(), Communicator))
    resolved = {}
    for what, qualname, base in checks:
        if not qualname or qualname == "auto":
            raise AssertionError(f"{what} names no class ({qualname!r})")
        cls = resolve_obj_by_qualname(qualname)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise AssertionError(f"{what} = {qualname!r} is not a {base.__name__} subclass")
        resolved[what] = cls
    backend = resolved.get("get_attn_backend_cls")
    return ", ".join(f"{what} -> {cls.__qualname__}" for what, cls in resolved.items()), backend


def _snapshot() -> dict[str, Any]:
    from kernelcore import platforms, plugins
    from kernelcore.custom_op import op_registry_oot
    from kernelcore.platforms import current_platform

    platforms.load_general_plugins()
    return {"platform": f"{type(current_platform).__module__}.{type(current_platform).__qualname__}",
            "plugins": sorted(f"{r.group}:{r.name}:{r.status}" for r in plugins.records()),
            "ops": sorted(f"{k}={v.__module__}.{v.__qualname__}" for k, v in op_registry_oot.items())}


def _spawned(conn) -> None:
    try:
        conn.send(_snapshot())
    except BaseException as exc:  # reported to the parent, which fails the check
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


def loads_the_same_when_spawned() -> str:
    import multiprocessing as mp

    here = _snapshot()
    parent, child = mp.get_context("spawn").Pipe()
    process = mp.get_context("spawn").Process(target=_spawned, args=(child,))
    process.start()
    there = parent.recv()
    process.join()
    if there != here:
        raise AssertionError(f"a spawned process sees {there}, this one {here}")
    return f"platform, {len(here['plugins'])} plugin records and {len(here['ops'])} op replacements identical"


def greedy_tokens_match_cpu(model: str) -> str:
    from kernelcore import LLM, SamplingParams

    llm = LLM(model, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    llm.shutdown()
    tokens = [o.outputs[0].token_ids for o in outs]
    reference = json.loads(_python(GREEDY.format(model=model, prompts=PROMPTS), KC_PLATFORM="cpu"))
    if tokens != reference:
        raise AssertionError(f"greedy tokens {tokens} differ from the CPU platform's {reference}")
    return f"{sum(map(len, tokens))} greedy tokens of {len(PROMPTS)} prompts identical to the CPU platform's"
