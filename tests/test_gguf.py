"""GGUF checkpoints: `kc serve model.gguf` / LLM("model.gguf") with the config, vocabulary and weights from the file.

Files are written here with gguf.GGUFWriter and gguf.quants from random transformers checkpoints (as llama.cpp's
converter lays them out, Llama's q/k permuted). References: the HF checkpoint itself for F32, and transformers
reading the same GGUF file (its own dequantizer, float32) for the quantized types, which kernelcore computes with
as stored. The real trained files (every K-quant among them) are tested in test_gguf_real.py.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from conftest_models import make_checkpoint, make_llama_checkpoint
from gguf_helpers import add_tokenizer, write_gguf


@pytest.fixture(autouse=True)
def exact_path(monkeypatch):
    """The float kernel for every type: these tests bound the error by float32 rounding. (The int path of the
    quality policy's types is bounded in test_cpu_gguf_kernels.py and held to its quality bound in
    test_gguf_real.py.)"""
    monkeypatch.setenv("KC_CPU_GGUF_INT_DOT", "none")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    llama = make_llama_checkpoint(str(root / "llama"))
    add_tokenizer(llama, 320)
    qwen2 = make_checkpoint("qwen2", str(root / "qwen2"))
    add_tokenizer(str(root / "tokenizer"), 320)  # a tokenizer-only directory, for --tokenizer
    out = {"llama": llama, "qwen2": qwen2, "tokenizer": str(root / "tokenizer")}
    for qtype in ("F32", "Q8_0", "Q4_0"):
        out[f"llama-{qtype}"] = write_gguf(llama, str(root / "llama" / f"model-{qtype}.gguf"), qtype)
    for qtype in ("F32", "Q8_0"):  # no embedded vocabulary: the tokenizer comes from --tokenizer
        out[f"qwen2-{qtype}"] = write_gguf(qwen2, str(root / "qwen2" / f"model-{qtype}.gguf"), qtype, with_vocab=False)
    # q, k and v of one fused weight in three types, and a row-parallel weight in a fourth
    out["llama-mixed"] = write_gguf(llama, str(root / "llama" / "model-mixed.gguf"), "Q8_0", override_types={
        "blk.0.attn_q.weight": "Q5_0", "blk.0.attn_k.weight": "Q4_1", "blk.0.attn_v.weight": "Q5_1",
        "blk.1.ffn_down.weight": "Q4_1", "blk.1.ffn_up.weight": "F16", "token_embd.weight": "Q4_0"})
    out["llama-unsupported"] = write_gguf(llama, str(root / "llama" / "model-q8_1.gguf"), "Q8_0",
                                          override_types={"blk.1.ffn_down.weight": "Q8_1"})
    return out


@functools.lru_cache(maxsize=8)
def reference(path: str):
    """transformers on an HF directory, or on a GGUF file through its own GGUF reader (``gguf_file=``)."""
    from transformers import AutoModelForCausalLM

    kwargs = {"gguf_file": os.path.basename(path)} if path.endswith(".gguf") else {}
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path) if kwargs else path, dtype=torch.float32,
                                                 **kwargs).eval()
    return model


def ref_logprobs(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(path: str, prompts: list[list[int]], max_tokens: int = 8, full_logprobs: bool = False, **kwargs):
    """Greedy outputs with prompt logprobs (every vocabulary entry when ``full_logprobs``), and the LLM's model."""
    from kernelcore import LLM, SamplingParams

    llm = LLM(path, kv_cache_memory=1 << 24, block_size=8, max_model_len=256, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            prompt_logprobs=320 if full_logprobs else 0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, outputs


def check_exact(outputs, prompts, model, abs_tol: float = 5e-4) -> None:
    for output, tokens in zip(outputs, prompts, strict=True):
        generated = list(output.outputs[0].token_ids)
        ref = ref_logprobs(model, tokens + generated)
        ours = [entry[t].logprob for entry, t in zip(output.prompt_logprobs[1:], tokens[1:], strict=True)]
        expected = ref[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].tolist()
        assert ours == pytest.approx(expected, abs=abs_tol)
        assert generated == ref[len(tokens) - 1:-1].argmax(-1).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f32_gguf_logits_equal_the_hf_checkpoint(files, arch):
    """Config from the metadata, names mapped, Llama's q/k permutation undone: the HF checkpoint's logits."""
    prompts = [prompt(9, 1), prompt(40, 2)]
    llm, outputs = run(files[f"{arch}-F32"], prompts, tokenizer=files["tokenizer"] if arch == "qwen2" else None)
    assert llm.config.model.quantization == "gguf" and llm.config.model.architecture.startswith(
        {"llama": "Llama", "qwen2": "Qwen2"}[arch])
    check_exact(outputs, prompts, reference(files[arch]), abs_tol=1e-4)
    llm.shutdown()


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "mistral"])
def test_more_architectures_from_general_architecture(arch, tmp_path):
    """qwen3 (q/k norms; head_dim from ``qwen3.attention.key_length``, which transformers' mapping drops), phi3
    (fused qkv and gate_up tensors), mistral (stored as "llama", q/k permuted): the HF checkpoint's logits."""
    checkpoint = make_checkpoint(arch, str(tmp_path / arch), **({"sliding_window": None} if arch == "mistral" else {}))
    add_tokenizer(checkpoint, 320)
    prompts = [prompt(9, 1), prompt(40, 2)]
    llm, outputs = run(write_gguf(checkpoint, str(tmp_path / "model.gguf"), "F32"), prompts)
    check_exact(outputs, prompts, reference(checkpoint), abs_tol=1e-4)
    llm.shutdown()


@pytest.mark.parametrize("name", ["llama-Q8_0", "llama-Q4_0", "qwen2-Q8_0", "llama-mixed"])
def test_quantized_gguf_computes_with_the_stored_blocks(files, name):
    """Every quantized layer keeps the file's blocks (no float or int8 copy) and computes with them: transformers
    on the same file, dequantized to float32, within float32 rounding."""
    prompts = [prompt(9, 3), prompt(30, 4)]
    llm, outputs = run(files[name], prompts)
    model = llm.engine_core.executor.worker.model_runner.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    stored = "Q8_0" if name != "llama-mixed" else None
    parts = [(p.gguf_type, p.qweight.dtype, p.output_size) for p in qkv.quant_method.parts]
    q_size, kv_size = qkv.q_size, qkv.kv_size
    if stored:
        assert parts == [(stored if name != "llama-Q4_0" else "Q4_0", torch.uint8, q_size + 2 * kv_size)]
    else:
        assert parts == [("Q5_0", torch.uint8, q_size), ("Q4_1", torch.uint8, kv_size), ("Q5_1", torch.uint8, kv_size)]
    assert qkv.weight.numel() == 0  # the float weight the layer was built with is gone
    embed = model.model.embed_tokens
    assert [p.gguf_type for p in embed.quant_method.parts] == [{"llama-mixed": "Q4_0", "llama-Q4_0": "Q4_0"}.get(
        name, "Q8_0")]
    if name == "llama-mixed":  # a fused gate_up of an F16 and a Q8_0 part
        assert [p.gguf_type for p in model.model.layers[1].mlp.gate_up_proj.quant_method.parts] == ["Q8_0", "F32"]
    check_exact(outputs, prompts, reference(files[name]))
    llm.shutdown()


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])  # tp=2 spawns a worker
def test_a_shard_that_would_cut_a_super_block_is_computed_in_float(tmp_path, tp):
    """Q6_K rows of 768 values are 3 super-blocks of 256: TP=1 computes with them; a row-parallel rank of TP=2
    holds 384 values per row, which no whole number of blocks makes, so that layer is dequantized to float."""
    checkpoint = make_llama_checkpoint(str(tmp_path / "llama"), intermediate_size=768)
    add_tokenizer(checkpoint, 320)
    path = write_gguf(checkpoint, str(tmp_path / "model.gguf"), "Q8_0",
                      override_types={"blk.0.ffn_down.weight": "Q6_K"})
    prompts = [prompt(9, 3), prompt(30, 4)]
    llm, outputs = run(path, prompts, tensor_parallel_size=tp)
    if tp == 1:
        down = llm.engine_core.executor.worker.model_runner.model.model.layers[0].mlp.down_proj
        assert [p.gguf_type for p in down.quant_method.parts] == ["Q6_K"]
    check_exact(outputs, prompts, reference(path))
    llm.shutdown()


@pytest.mark.slow
def test_tensor_parallel_on_a_quantized_file(files):
    """TP=2: each rank takes its rows (column-parallel) or its blocks of each row (row-parallel) of the stored
    blocks, for every type of the mixed file."""
    prompts = [prompt(9, 3), prompt(30, 4)]
    llm, outputs = run(files["llama-mixed"], prompts, tensor_parallel_size=2)
    check_exact(outputs, prompts, reference(files["llama-mixed"]))
    llm.shutdown()


def test_an_unsupported_tensor_type_is_refused_naming_it(files):
    from helpers import run_kc

    from kernelcore.config_builder import build_config
    from kernelcore.models.gguf_checkpoint import GGUFError

    with pytest.raises(GGUFError, match=r"'blk\.1\.ffn_down\.weight' .* has type Q8_1.*'gguf_q8_1'"):
        build_config(model=files["llama-unsupported"])
    result = run_kc("serve", files["llama-unsupported"], check=False)
    assert result.returncode == 1 and "'blk.1.ffn_down.weight'" in result.stderr and "Q8_1" in result.stderr


def test_the_vocabulary_comes_from_the_file_or_from_tokenizer(files):
    from kernelcore.engine.tokenizer import try_get_tokenizer

    embedded = try_get_tokenizer(files["llama-Q8_0"])
    hf = try_get_tokenizer(files["llama"])
    assert embedded.get_vocab() == hf.get_vocab()
    assert embedded("w17 w300 w42")["input_ids"] == hf("w17 w300 w42")["input_ids"]
    assert embedded.decode([262, 272, 300]) == hf.decode([262, 272, 300]) == "w262 w272 w300"
    assert try_get_tokenizer(files["qwen2-Q8_0"]) is None  # none embedded: token ids only, unless --tokenizer


@pytest.mark.slow
def test_kc_serve_a_q8_0_file_with_the_openai_client(files):
    import openai
    from test_server_e2e import start_server, stop_server

    from kernelcore.engine.tokenizer import try_get_tokenizer

    proc, url = start_server(files["llama-Q8_0"], "--max-model-len", "256", "--kv-cache-memory", "16MiB")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        [model] = [m.id for m in client.models.list().data]
        assert model == "model-Q8_0.gguf"
        prompt_ids = [1, 262, 17, 300, 42, 99]
        completion = client.completions.create(model=model, prompt=prompt_ids, max_tokens=8, temperature=0, logprobs=1,
                                               extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
        by_text = client.completions.create(model=model, prompt="w17 w300", max_tokens=2, temperature=0)
    finally:
        stop_server(proc)
    model_ref = reference(files["llama-Q8_0"])
    generated: list[int] = []
    for _ in range(8):  # the reference's greedy continuation
        generated.append(int(ref_logprobs(model_ref, prompt_ids + generated)[-1].argmax()))
    tokenizer = try_get_tokenizer(files["llama-Q8_0"])
    prompt_text = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert completion.usage.completion_tokens == 8
    assert by_text.usage.prompt_tokens == len(tokenizer("w17 w300")["input_ids"])  # the embedded vocabulary
    served_ids = [int(t.split(":")[1]) for t in completion.choices[0].logprobs.tokens]
    assert served_ids == generated
    expected_text = tokenizer.decode(prompt_ids + generated, skip_special_tokens=True)[len(prompt_text):]
    if "\ufffd" not in expected_text:  # byte-fallback tokens that end mid-character are held back, not decoded
        assert completion.choices[0].text == expected_text


def vendored_converter() -> str | None:
    """llama.cpp's convert_hf_to_gguf.py from an unpacked llama-cpp-python sdist, when one is at hand
    (KC_LLAMACPP_SRC, or benchmarks/llamacpp_build.py's cache); CI has none and skips."""
    import glob

    roots = [os.environ.get("KC_LLAMACPP_SRC", "")]
    roots += glob.glob(os.path.join(os.environ.get("KC_CACHE_DIR", ""), "llamacpp", "llama_cpp_python-*", "vendor",
                                    "llama.cpp"))
    return next((r for r in roots if r and os.path.isfile(os.path.join(r, "convert_hf_to_gguf.py"))), None)


@pytest.mark.slow
@pytest.mark.skipif(vendored_converter() is None, reason="no llama.cpp source (KC_LLAMACPP_SRC) to convert with")
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_files_made_by_llama_cpps_converter(tmp_path, arch):
    """The real converter's f32 and q8_0 output: the same checks as the files written here."""
    import subprocess
    import sys

    src = vendored_converter()
    checkpoint = make_checkpoint(arch, str(tmp_path / arch), sliding_window=None) if arch == "mistral" \
        else make_llama_checkpoint(str(tmp_path / arch))
    add_tokenizer(checkpoint, 320)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(src, "gguf-py"), src]))
    prompts = [prompt(9, 3), prompt(30, 4)]
    for outtype in ("f32", "q8_0"):
        out = str(tmp_path / arch / f"model-{outtype}.gguf")
        subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), checkpoint, "--outtype", outtype,
                        "--outfile", out], check=True, env=env, capture_output=True)
        llm, outputs = run(out, prompts)
        check_exact(outputs, prompts, reference(checkpoint) if outtype == "f32" else reference(out),
                    abs_tol=1e-4 if outtype == "f32" else 5e-4)
        llm.shutdown()


def test_the_cluster_fingerprint_of_a_gguf_file(files, tmp_path):
    """Hosts joining one engine compare fingerprints: a GGUF file is described by its tensor table and size (a
    copy elsewhere matches; another quantization of the same checkpoint does not)."""
    import shutil

    from kernelcore.config_builder import build_config
    from kernelcore.config_fingerprint import fingerprint, mismatches

    copy = shutil.copy(files["llama-Q8_0"], tmp_path / "copy.gguf")
    q8, q8_copy, q4 = (fingerprint(build_config(model=str(p)))
                       for p in (files["llama-Q8_0"], copy, files["llama-Q4_0"]))
    assert q8 == q8_copy and q8["quantization"] == "gguf"
    assert [m.split(" is ")[0] for m in mismatches(q8, q4, "host-b")] == ["model checkpoint"]
