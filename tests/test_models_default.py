"""The embedded default model: generated once, atomically, in real HF format."""

from __future__ import annotations

import os
import threading

import torch


def test_default_model_is_a_loadable_hf_checkpoint_with_tokenizer_and_chat_template(tmp_path, monkeypatch):
    monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kernelcore.models.default_model import ensure_default_model

    paths, errors = [], []

    def build():
        try:
            paths.append(ensure_default_model())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]  # racing builders: one rename wins
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and paths[0] == paths[1] == str(tmp_path / "default-model-v1")
    path = paths[0]
    assert sorted(os.listdir(tmp_path)) == ["default-model-v1"]  # no temp dirs left behind
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert os.path.isfile(os.path.join(path, name)), name
    assert ensure_default_model() == path

    tokenizer = AutoTokenizer.from_pretrained(path)
    text = "Hello, world! Ünïcödé 日本語 and numbers 12345."
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert "hi" in prompt and prompt.endswith("<|assistant|>\n")

    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.architectures == ["LlamaForCausalLM"] and model.config.vocab_size == len(tokenizer)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer)) and torch.isfinite(logits).all()


def test_build_config_without_model_uses_the_default_model(tmp_path, monkeypatch):
    monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
    from kernelcore.config_builder import build_config

    config = build_config(dtype="float32")
    assert config.model.model == str(tmp_path / "default-model-v1")
    assert config.model.architecture == "LlamaForCausalLM"
