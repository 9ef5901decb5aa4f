"""Model, op and CLI plugins through the pip-installed dummy packages and real entry points."""

import json

from helpers import run_kc, run_python


def test_eager_and_lazy_model_registration_through_a_plugin():
    out = run_python("""
        import sys, json
        from kernelcore import platforms, plugins
        from kernelcore.models.registry import model_registry as r
        platforms.load_general_plugins()
        result = {
            "eager_lazy": r.is_lazy("MyOPTForCausalLM"), "lazy_lazy": r.is_lazy("MyLazyLlama"),
            "lazy_imported_before": "kc_dummy_model.lazy_llama" in sys.modules,
            "builtin_lazy": r.is_lazy("LlamaForCausalLM"),
            "builtin_imported_before": any(f"builtin_plugins.models.{m}" in sys.modules
                                           for m in ("llama", "qwen", "mistral", "phi3", "gemma3", "qwen3_moe")),
            "owners": r.owners(),
        }
        info = r.inspect("MyLazyLlama")
        result["lazy_imported_after"] = "kc_dummy_model.lazy_llama" in sys.modules
        result["info"] = [info.is_text_generation, info.supports_tensor_parallel]
        print(json.dumps(result))
    """).stdout
    result = json.loads(out)
    assert result["eager_lazy"] is False and result["lazy_lazy"] is True and result["builtin_lazy"] is True
    assert result["lazy_imported_before"] is False and result["lazy_imported_after"] is True
    assert result["builtin_imported_before"] is False  # built-ins register lazily: nothing imported at start-up
    assert result["owners"]["MyLazyLlama"] == "dummy_model" and result["owners"]["LlamaForCausalLM"] == "models"
    assert result["info"] == [True, True]


def test_overriding_a_builtin_architecture_warns_and_kc_plugins_shows_the_owner():
    proc = run_kc("plugins", "--json", KC_DUMMY_OVERRIDE_OPT="1")
    report = json.loads(proc.stdout)
    assert report["models"]["OPTForCausalLM"] == "dummy_model"
    from builtin_plugins.models import ARCHITECTURES

    assert all(report["models"][arch] == "models" for arch in ARCHITECTURES if arch != "OPTForCausalLM")
    assert "OPTForCausalLM" in proc.stderr and "models" in proc.stderr and "dummy_model" in proc.stderr


def test_general_plugin_that_raises_stops_start_up_naming_it():
    proc = run_python("""
        from kernelcore import platforms, plugins
        platforms.load_general_plugins()
    """, check=False, KC_DUMMY_MODEL_RAISE="1")
    assert proc.returncode != 0
    assert "general plugin 'dummy_model' (distribution kc-dummy-model) raised in register_models in process frontend" \
        in proc.stderr


def test_oot_op_swap_by_class_name_dispatches_to_forward_oot_on_the_vendor_platform():
    out = run_python("""
        import torch
        from kernelcore import platforms, plugins
        from kernelcore.config import KernelConfig, set_current_config
        from kernelcore.layers.rotary import RotaryEmbedding, get_rope
        platforms.load_general_plugins()
        with set_current_config(KernelConfig(custom_ops=["all"])):
            rope = get_rope(16, 16, 64, 10000.0)
        q, k = torch.randn(3, 32), torch.randn(3, 16)
        out_q, _ = rope(torch.arange(3), q, k)
        with set_current_config(KernelConfig(custom_ops=["none"])):
            native = RotaryEmbedding(16, 16, 64, 10000.0)
        print(type(rope).__name__, rope.addition_config, rope.forward_method_name, type(rope).num_oot_calls,
              torch.allclose(out_q, native(torch.arange(3), q, k)[0]), native.forward_method_name)
    """, KC_DUMMY_DEVICE="1").stdout.split()
    assert out == ["DummyRotaryEmbedding", "True", "forward_oot", "1", "True", "forward_native"]


def test_op_replacement_plugin_swaps_rmsnorm_on_the_builtin_platform():
    out = run_python("""
        from kernelcore import platforms, plugins
        from kernelcore.config import KernelConfig, set_current_config
        from kernelcore.layers.norm import RMSNorm
        platforms.load_general_plugins()
        with set_current_config(KernelConfig(custom_ops=["all", "-rms_norm"])):
            off = RMSNorm(8)
        with set_current_config(KernelConfig(custom_ops=["all"])):
            on = RMSNorm(8)
        print(type(on).__name__, on.forward_method_name, off.forward_method_name)
    """, KC_DUMMY_OPS="1").stdout.split()
    assert out == ["CountingRMSNorm", "forward_cpu", "forward_native"]  # "-rms_norm" still reaches the replacement


def test_pre_register_and_update_extends_each_command_once():
    out = run_python("""
        import click
        from kernelcore import platforms, plugins
        from kernelcore.entrypoints.cli import cli
        platforms.load_general_plugins()
        ctx = click.Context(cli)
        @cli.command("probe")
        def probe(**kw):
            pass
        probe.kc_engine_args = True
        for _ in range(3):
            cli.get_command(ctx, "probe")
        plugins.get_plugin_manager().hook.pre_register_and_update(parser=probe)  # idempotent even if re-run
        plugins.get_plugin_manager().hook.pre_register_and_update(parser=None)
        print(sum(p.name == "dummy_flag" for p in probe.params))
    """, KC_DUMMY_DEVICE="1").stdout.split()
    assert out == ["1"]
