"""Resolver registry order, isolation, path confinement (traversal cases) and the HF resolver failing fast offline."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from kernelcore.lora.adapter import LoRAAdapterError, LoRANotFoundError, check_adapter_config, read_adapter_config
from kernelcore.lora.resolver import (
    LoRAPathError,
    LoRAResolverError,
    LoRAResolverRegistry,
    build_registry,
    child_of,
    confine,
    resolve,
)


def fake_adapter(path) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8}, f)
    return str(path)


class Fixed:
    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def resolve_lora(self, base_model_name, lora_name):
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_resolvers_run_by_order_then_name_and_stop_at_the_first_hit():
    registry = LoRAResolverRegistry()
    late, b, a = Fixed("/late"), Fixed(None), Fixed("/a")
    registry.register("late", late, order=90)
    registry.register("b", b, order=10)
    registry.register("a", a, order=50)
    assert registry.names() == ["b", "a", "late"]
    assert asyncio.run(resolve(registry, "base", "x")) == ("a", "/a")
    assert (b.calls, a.calls, late.calls) == (1, 1, 0)


def test_duplicate_and_unknown_resolver_names_are_errors():
    registry = LoRAResolverRegistry()
    registry.register("fs", Fixed(None))
    with pytest.raises(ValueError, match="already registered"):
        registry.register("fs", Fixed(None))
    with pytest.raises(KeyError, match=r"LoRA resolver 'nope' not found. Available resolvers: \['fs'\]"):
        registry.get("nope")


def test_a_raising_resolver_is_named_and_async_resolvers_are_awaited():
    registry = LoRAResolverRegistry()
    registry.register("boom", Fixed(RuntimeError("disk on fire")), order=1)

    class Async:
        async def resolve_lora(self, base_model_name, lora_name):
            return f"/async/{lora_name}"

    with pytest.raises(LoRAResolverError, match="resolver 'boom'.*adapter 'x'.*disk on fire"):
        asyncio.run(resolve(registry, "base", "x"))
    registry = LoRAResolverRegistry()
    registry.register("async", Async())
    assert asyncio.run(resolve(registry, "base", "x")) == ("async", "/async/x")


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", "/etc", "a\\b", "x\x00y", ""])
def test_adapter_names_must_be_one_plain_component(tmp_path, name):
    with pytest.raises(LoRAPathError):
        child_of(str(tmp_path), name)


def test_symlinks_escaping_the_root_are_refused(tmp_path):
    root, outside = tmp_path / "root", fake_adapter(tmp_path / "outside")
    fake_adapter(root / "inside")
    os.symlink(outside, root / "escape")
    os.symlink(root / "inside", root / "alias")
    assert child_of(str(root), "inside") == os.path.realpath(root / "inside")
    assert child_of(str(root), "alias") == os.path.realpath(root / "inside")  # a link that stays inside is fine
    with pytest.raises(LoRAPathError, match="outside the adapter root"):
        child_of(str(root), "escape")
    with pytest.raises(LoRAPathError):
        confine(str(root), str(outside))
    with pytest.raises(LoRAPathError):
        confine(str(root), "inside/../../outside")


def test_builtin_filesystem_resolver_is_rebuilt_per_lookup(tmp_path, monkeypatch):
    from kernelcore import platforms

    platforms.load_general_plugins()
    monkeypatch.delenv("KC_LORA_RESOLVER_DIR", raising=False)
    monkeypatch.delenv("KC_LORA_HF_REPOS", raising=False)
    assert build_registry().names() == []  # unset: inactive
    monkeypatch.setenv("KC_LORA_RESOLVER_DIR", str(tmp_path))  # set later: seen by the next lookup
    registry = build_registry()
    assert registry.names() == ["filesystem"]
    assert asyncio.run(resolve(registry, "base", "missing")) is None
    fake_adapter(tmp_path / "mine")
    assert asyncio.run(resolve(registry, "base", "mine")) == ("filesystem", os.path.realpath(tmp_path / "mine"))
    with pytest.raises(LoRAResolverError, match="filesystem.*'..'"):
        asyncio.run(resolve(registry, "base", ".."))
    monkeypatch.setenv("KC_LORA_HF_REPOS", "org/*")
    assert build_registry().names() == ["filesystem", "hf_hub"]


def test_hf_resolver_only_for_allowed_repos_and_fails_fast_offline(monkeypatch):
    from builtin_plugins.lora.hf_hub import HFHubResolver

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolver = HFHubResolver(["allowed/*"], timeout=20)
    assert asyncio.run(resolver.resolve_lora("base", "other/repo")) is None
    assert asyncio.run(resolver.resolve_lora("base", "plainname")) is None
    with pytest.raises(LoRAPathError):
        asyncio.run(resolver.resolve_lora("base", "allowed/repo/../../x"))
    started = time.monotonic()
    with pytest.raises(Exception, match="(?i)offline|unreachable|cache|connect"):
        asyncio.run(resolver.resolve_lora("base", "allowed/repo/sub"))
    assert time.monotonic() - started < 15


def test_adapter_config_checks(tmp_path):
    with pytest.raises(LoRANotFoundError):
        read_adapter_config(str(tmp_path))
    assert check_adapter_config({"r": 8, "lora_alpha": 16}, 16) == (8, 2.0)
    assert check_adapter_config({"r": 4, "lora_alpha": 8, "use_rslora": True}, 16) == (4, 4.0)
    for bad, message in (({"r": 32}, "max-lora-rank"), ({"r": 4, "peft_type": "IA3"}, "peft_type"),
                         ({"r": 4, "use_dora": True}, "use_dora"), ({"r": 4, "bias": "all"}, "bias"),
                         ({"r": 0}, "positive")):
        with pytest.raises(LoRAAdapterError, match=message):
            check_adapter_config(bad, 16)


def test_one_resolution_per_name_at_a_time_and_no_lock_left_behind(tmp_path, monkeypatch):
    from kernelcore.lora import serving as serving_mod

    class Engine:
        def __init__(self):
            self.added = []

        async def add_lora(self, lora_id, path, name=None):
            self.added.append(name)

    calls = []

    async def slow_resolve(registry, base, name):
        calls.append(name)
        await asyncio.sleep(0.05)
        return ("fake", str(tmp_path)) if name.startswith("ok") else None

    monkeypatch.setattr(serving_mod, "resolve", slow_resolve)
    monkeypatch.setattr(serving_mod, "build_registry", lambda: None)
    serving = serving_mod.LoRAServing.__new__(serving_mod.LoRAServing)
    serving.engine, serving.base_model_name, serving.allow_runtime_updating = Engine(), "base", True
    serving.adapters, serving._next_id, serving._locks = {}, 1, {}
    serving.check = lambda path: None

    async def main():
        return await asyncio.gather(*(serving.get(n) for n in ["ok-a"] * 5 + ["nope"] * 3))

    results = asyncio.run(main())
    assert calls.count("ok-a") == 1 and serving.engine.added == ["ok-a"]
    assert len({r.lora_id for r in results[:5]}) == 1 and results[5:] == [None] * 3
    assert serving._locks == {}
