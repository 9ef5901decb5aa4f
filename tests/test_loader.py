"""Weight loading: formats, shards, dtypes and the errors a user sees."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest_models import make_llama_checkpoint, make_opt_checkpoint
from safetensors.torch import load_file, save_file
from test_models_parity import load_hf, make_runner


def prefill_logits(runner, ids):
    from kernelcore.executor.model_runner import SeqBatchEntry

    return runner.execute([SeqBatchEntry(ids, 0, list(range(-(-len(ids) // 16))), num_logits=len(ids))])


@pytest.mark.parametrize("fmt", ["bin", "sharded-safetensors", "sharded-bin"])
def test_bin_and_sharded_checkpoints_load(tmp_path, fmt):
    save_kwargs = {"max_shard_size": "60KB"} if fmt.startswith("sharded") else {}
    path = make_opt_checkpoint(str(tmp_path / fmt), safe_serialization=not fmt.endswith("bin"), save_kwargs=save_kwargs)
    files = os.listdir(path)
    if fmt.startswith("sharded"):
        assert any(f.endswith(".index.json") for f in files), files
    if fmt.endswith("bin"):
        assert not any(f.endswith(".safetensors") for f in files), files
    ids = list(range(5, 30))
    with torch.no_grad():
        expected = load_hf(path)(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(prefill_logits(make_runner(path, ["all"]), ids), expected, atol=2e-4, rtol=1e-4)


def test_bfloat16_weights_and_logits(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "m"))
    runner = make_runner(path, ["all"], dtype="bfloat16")
    assert runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert runner.attn_layers[0].kv_cache.dtype == torch.bfloat16
    ids = list(range(5, 30))
    logits = prefill_logits(runner, ids)
    assert logits.dtype == torch.float32
    reference = prefill_logits(make_runner(path, ["all"]), ids)
    assert (logits - reference).abs().max() < 0.15 * reference.abs().max()
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() > 0.8


def test_bfloat16_decode_logits_reuse_one_float32_buffer(tmp_path):
    from builtin_plugins.cpu.model_runner import CpuModelRunner
    from kernelcore.executor.model_runner import SeqBatchEntry

    runner = make_runner(make_llama_checkpoint(str(tmp_path / "m")), ["all"], dtype="bfloat16",
                         runner_cls=CpuModelRunner)
    first = prefill_logits(runner, list(range(5, 30)))
    decode = [SeqBatchEntry([7], 25, [0, 1])]  # one decode row after the prompt
    buffered = runner.execute(decode)
    assert buffered.dtype == torch.float32 and buffered.shape == (1, first.shape[1])
    assert buffered.data_ptr() == first.data_ptr()  # the same float32 buffer, step after step
    buffered = buffered.clone()
    runner.max_buffered_logits = 0  # every step gets a tensor of its own
    fresh = runner.execute(decode)
    assert fresh.data_ptr() != first.data_ptr()
    torch.testing.assert_close(fresh, buffered, atol=0, rtol=0)


def test_missing_weight_files_names_the_directory(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "m"))
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "m")):
        make_runner(path, ["all"])


def test_missing_shard_is_named(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "m"), save_kwargs={"max_shard_size": "60KB"})
    shard = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[0]
    os.remove(os.path.join(path, shard))
    with pytest.raises(FileNotFoundError, match=shard):
        make_runner(path, ["all"])


def test_missing_config_is_a_clear_error(tmp_path):
    from kernelcore.config_builder import build_config

    with pytest.raises(FileNotFoundError, match="config.json"):
        build_config(model=str(tmp_path), dtype="float32")


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "m"))
    weights = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name] = torch.zeros(64, 100)
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"down_proj.*\(64, 100\).*\(64, 128\)"):
        make_runner(path, ["all"])


def test_missing_tensor_is_named(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "m"))
    weights = load_file(os.path.join(path, "model.safetensors"))
    del weights["model.norm.weight"]
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.norm.weight"):
        make_runner(path, ["all"])


def test_unknown_architecture_lists_registered_ones_and_their_plugin(tmp_path):
    from kernelcore.config_builder import build_config

    path = make_llama_checkpoint(str(tmp_path / "m"))
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        data = json.load(f)
    data["architectures"] = ["FooForCausalLM"]
    with open(config_path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ValueError, match=r"FooForCausalLM.*LlamaForCausalLM \(plugin models\)") as info:
        build_config(model=path, dtype="float32")
    assert "OPTForCausalLM (plugin models)" in str(info.value)


def test_registered_lazily_in_string_form():
    from kernelcore import platforms
    from kernelcore.models.registry import model_registry

    platforms.load_general_plugins()
    for arch in ("OPTForCausalLM", "LlamaForCausalLM"):
        assert model_registry.is_lazy(arch)
        info = model_registry.inspect(arch)
        assert info.supports_tensor_parallel and info.supports_lora and info.is_text_generation


def test_cpu_runner_reuses_one_float32_buffer_for_low_precision_logits(tmp_path):
    from builtin_plugins.cpu.model_runner import CpuModelRunner
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner

    config = build_config(model=make_llama_checkpoint(str(tmp_path / "m")), max_num_seqs=4)
    runner, plain = CpuModelRunner(config), ModelRunner(config)
    logits = torch.randn(3, runner.vocab_size + 8).to(torch.bfloat16)  # a padded vocabulary
    first = runner.logits_to_float32(logits)
    again = runner.logits_to_float32(logits[:2])
    assert (first.dtype == torch.float32 and first.shape == (3, runner.vocab_size)
            and again.data_ptr() == first.data_ptr())
    torch.testing.assert_close(again, plain.logits_to_float32(logits[:2]), atol=0, rtol=0)
    assert runner.logits_to_float32(torch.randn(5, runner.vocab_size).bfloat16()).data_ptr() != first.data_ptr()


def test_a_max_model_len_past_the_models_positions_is_refused(tmp_path):
    """A request past a model's position table failed inside the forward and took the engine down; now the
    length is refused when the server starts (llama: 256 positions; OPT: a learned table of 256)."""
    from kernelcore.config_builder import build_config

    llama, opt = make_llama_checkpoint(str(tmp_path / "llama")), make_opt_checkpoint(str(tmp_path / "opt"))
    for path, architecture in ((llama, "LlamaForCausalLM"), (opt, "OPTForCausalLM")):
        assert build_config(model=path, max_model_len=256).model.max_model_len == 256
        with pytest.raises(ValueError, match=f"max_model_len 257 is longer than the 256 positions {architecture}"):
            build_config(model=path, max_model_len=257)


def test_dynamic_rope_scaling_serves_the_scaled_length(tmp_path):
    from kernelcore.config_builder import build_config

    path = make_llama_checkpoint(str(tmp_path / "m"), rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    assert build_config(model=path, max_model_len=1024).model.max_model_len == 1024
    with pytest.raises(ValueError, match="longer than the 1024 positions"):
        build_config(model=path, max_model_len=1025)
    runner = make_runner(path, ["all"], max_model_len=1024)  # the rotary table covers the scaled length
    ids = [5 + i % 300 for i in range(600)]
    assert prefill_logits(runner, ids).isfinite().all()
