"""Every example of docs/hooks.md (docs/examples/hooks/<hook>.py) is registered with a fresh plugin manager and
its hook called with real arguments: the examples run, implement the hook they document, and do what they say."""

import asyncio
import importlib.util
import os

import click
import pluggy
import pytest

from kernelcore import hookspecs
from kernelcore.attention import AttentionSelector
from kernelcore.config import KernelConfig
from kernelcore.kernels import KernelTable, torch_rms_norm
from kernelcore.lora.resolver import LoRAResolverRegistry
from kernelcore.models import ModelRegistry
from kernelcore.platforms import Platform

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "docs", "examples", "hooks")
HOOKS = sorted(name for name, fn in vars(hookspecs).items() if hasattr(fn, "kernelcore_spec"))


def load_example(hook: str):
    spec = importlib.util.spec_from_file_location(f"example_{hook}", os.path.join(EXAMPLES, f"{hook}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    platforms = [v for v in vars(module).values()
                 if isinstance(v, type) and issubclass(v, Platform) and v is not Platform]
    plugin = platforms[0]() if platforms else module
    pm = pluggy.PluginManager("kernelcore")
    pm.add_hookspecs(hookspecs)
    pm.register(plugin, name="example")
    pm.check_pending()
    assert [impl.plugin_name for impl in getattr(pm.hook, hook).get_hookimpls()] == ["example"]
    return getattr(pm.hook, hook)


def test_every_hook_has_an_example():
    assert sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py")) == HOOKS


def test_detect_platform(monkeypatch):
    monkeypatch.setattr(os.path, "exists", lambda path: path == "/dev/nova0")
    assert load_example("detect_platform")() == ["nova_kc.platform.NovaPlatform"]
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert load_example("detect_platform")() == []


def test_pre_register_and_update_is_idempotent():
    hook, command = load_example("pre_register_and_update"), click.Command("serve")
    for parser in (command, command, None):
        hook(parser=parser)
    assert [p.name for p in command.params] == ["nova_cores"]


def test_config_hooks():
    config = KernelConfig()
    load_example("apply_config_platform_defaults")(config=config)
    assert config.model.dtype == "bfloat16" and config.scheduler.max_num_seqs == 64
    load_example("check_and_update_config")(config=config)
    assert config.parallel.worker_cls == "nova_kc.worker.NovaWorker"
    config.parallel.tensor_parallel_size = 16
    with pytest.raises(ValueError, match="at most 8"):
        load_example("check_and_update_config")(config=config)
    load_example("update_block_size_for_backend")(config=config)
    assert config.cache.block_size == 64
    user = KernelConfig(user_set=frozenset({"cache.block_size"}))
    load_example("update_block_size_for_backend")(config=user)
    assert user.cache.block_size == 16


def test_validate_environ(monkeypatch):
    monkeypatch.setenv("NOVA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match="no Nova device"):
        load_example("validate_environ")(config=KernelConfig())
    monkeypatch.setenv("NOVA_VISIBLE_DEVICES", "0")
    load_example("validate_environ")(config=KernelConfig())


def test_selection_hooks():
    selector = AttentionSelector(head_size=64, num_heads=4, num_kv_heads=2, dtype="float32", block_size=16)
    assert (load_example("get_attn_backend_cls")(selector=selector)
            == "builtin_plugins.cpu.attention.CpuAttentionBackend")
    assert load_example("get_device_communicator_cls")() == "kernelcore.distributed.TorchDistCommunicator"


def test_register_ops_imports_nothing_off_its_device():
    load_example("register_ops")()  # the CPU platform here: nova_kc.ops is not imported


def test_registration_hooks():
    import torch

    registry = ModelRegistry()
    load_example("register_models")(registry=registry)
    assert registry.is_lazy("NovaLMForCausalLM")
    table = KernelTable()
    load_example("register_kernels")(kernels=table)
    x = torch.randn(2, 8)
    assert torch.equal(table.get("gelu_and_mul")(x), torch.nn.functional.gelu(x[:, :4]) * x[:, 4:])
    table.register("rms_norm", lambda *a: None)
    load_example("register_triton_kernel_overrides")(kernels=table)
    assert table.get("rms_norm") is torch_rms_norm and table.is_overridden("rms_norm")
    assert not table.has("fused_add_rms_norm")  # only kernels the table has are overridden


def test_register_lora_resolvers(tmp_path):
    registry = LoRAResolverRegistry()
    load_example("register_lora_resolvers")(registry=registry)
    resolver = registry.get("nova_shared")
    resolver.root = str(tmp_path)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "adapter_config.json").write_text("{}")
    assert resolver.resolve_lora("base", "sql") == str(tmp_path / "sql")
    assert resolver.resolve_lora("base", "other") is None
    with pytest.raises(ValueError):
        resolver.resolve_lora("base", "../etc")


def test_register_endpoints():
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    class Engine:
        num_requests_running, num_requests_waiting = 2, 1

    async def go():
        app = web.Application()
        load_example("register_endpoints")(app=app, engine=Engine())
        async with TestClient(TestServer(app)) as client:
            reply = await client.get("/plugins/nova/status")
            return await reply.json()

    assert asyncio.run(go()) == {"running": 2, "waiting": 1}


def test_get_graph_capture_backend_cls():
    config = KernelConfig()
    assert load_example("get_graph_capture_backend_cls")(config=config) == "nova_kc.graphs.NovaGraphBackend"
    config.parallel.tensor_parallel_size = 2
    assert load_example("get_graph_capture_backend_cls")(config=config) is None


def test_register_quantization_methods():
    from kernelcore.layers.linear import Int8LinearMethod
    from kernelcore.quantization import QuantizationRegistry

    registry = QuantizationRegistry()
    load_example("register_quantization_methods")(registry=registry)
    assert issubclass(registry.get("nova_int8"), Int8LinearMethod)


def test_register_executor_backends():
    from kernelcore.executor.registry import ExecutorRegistry

    registry = ExecutorRegistry()
    load_example("register_executor_backends")(registry=registry)
    assert "slurm" in registry.names()


def test_register_structured_output_backends():
    from kernelcore.structured_output.backend import StructuredOutputBackendRegistry

    registry = StructuredOutputBackendRegistry()
    registry.register("guidance", "builtin:Backend", order=10)
    load_example("register_structured_output_backends")(registry=registry)
    assert registry.names() == ["nova_grammar", "guidance"]  # auto tries it first


def test_register_parsers():
    from kernelcore.entrypoints.reasoning_parsers import ReasoningParserRegistry
    from kernelcore.entrypoints.tool_parsers import ToolParserRegistry

    tools = ToolParserRegistry()
    load_example("register_tool_parsers")(registry=tools)
    parser = tools.get("nova_call")(None)
    assert parser.parse('CALL get_weather {"city": "Paris"}', True).calls == [("get_weather", '{"city": "Paris"}')]
    assert parser.parse("CALL get_weather {bad", True).content == "CALL get_weather {bad"
    assert parser.parse("plain answer", True).content == "plain answer"
    reasoning = ReasoningParserRegistry()
    load_example("register_reasoning_parsers")(registry=reasoning)
    assert reasoning.get("nova_thought")(None).split("<thought>hmm</thought>yes", True) == ("hmm", "yes")


def test_register_speculative_proposers():
    from kernelcore.config import SpeculativeConfig
    from kernelcore.speculative.proposer import ProposalRequest, SpeculativeProposerRegistry

    registry = SpeculativeProposerRegistry()
    load_example("register_speculative_proposers")(registry=registry)
    config = KernelConfig(speculative=SpeculativeConfig("repeat_last", 4, options={"max_run": 2}))
    proposer = registry.factory("repeat_last")(config, 100)
    assert proposer.propose([ProposalRequest("a", [5, 9], 4), ProposalRequest("b", [7], 1)]) == [[9, 9], [7]]


def test_report_components(monkeypatch):
    import ctypes.util

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert load_example("report_components")() == [
        {"nova.runtime": "missing: libnova_runtime not found; the reference kernels run instead"}]
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"lib{name}.so.1")
    assert load_example("report_components")() == [{"nova.runtime": "ok: libnova_runtime"}]
