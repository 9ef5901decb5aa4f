"""Every common tokenizer format serves text: a Llama checkpoint with only a SentencePiece tokenizer.model,
and one with a tiktoken-format BPE file, each through the real server and the openai client; a checkpoint
whose tokenizer files cannot load, or that has none, fails at start-up naming what it found and what is missing."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os

import openai
import pytest
import torch
from conftest_models import make_llama_checkpoint
from helpers import run_kc
from test_server_e2e import start_server, stop_server

pytestmark = pytest.mark.slow  # starts kc serve

PROMPT = "Once upon a time, the old clockmaker"


def sentencepiece_checkpoint(path: str) -> str:
    import sentencepiece as spm

    from kernelcore.models.default_model import TEXT

    make_llama_checkpoint(path, vocab_size=320)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT.splitlines()), model_writer=model, vocab_size=320,
                                   model_type="bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    with open(os.path.join(path, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>"}, f)
    return path


def tiktoken_checkpoint(path: str) -> str:
    """tiktoken's file format: one ``base64(token bytes) rank`` line per token (Llama 3's original/tokenizer.model)."""
    from tiktoken._educational import bpe_train

    from kernelcore.models.default_model import TEXT

    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its merges
        ranks = bpe_train(TEXT, 300, pattern)
    make_llama_checkpoint(path, vocab_size=302, bos_token_id=300, eos_token_id=301, pad_token_id=None)
    with open(os.path.join(path, "tokenizer.model"), "w") as f:
        f.writelines(f"{base64.b64encode(token).decode()} {rank}\n"
                     for token, rank in sorted(ranks.items(), key=lambda x: x[1]))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin|>", "eos_token": "<|end|>",
                   "extra_special_tokens": ["<|begin|>", "<|end|>"]}, f)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["sentencepiece", "tiktoken"])
def test_checkpoint_with_only_this_tokenizer_serves_text(tmp_path, fmt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = (sentencepiece_checkpoint if fmt == "sentencepiece" else tiktoken_checkpoint)(str(tmp_path / fmt))
    assert not os.path.exists(os.path.join(path, "tokenizer.json"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                          max_new_tokens=12, do_sample=False, pad_token_id=hf.config.eos_token_id)
    expected_ids = out[0, len(prompt_ids):].tolist()
    proc, url = start_server(path, "--max-model-len", "128")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        result = client.completions.create(model=fmt, prompt=PROMPT, max_tokens=12, temperature=0.0)
        assert result.usage.prompt_tokens == len(prompt_ids)
        if tokenizer.eos_token_id in expected_ids:
            expected_ids = expected_ids[:expected_ids.index(tokenizer.eos_token_id)]
        assert result.choices[0].text == tokenizer.decode(expected_ids, skip_special_tokens=True)
        assert result.choices[0].text  # the server read and wrote text
    finally:
        stop_server(proc)


@pytest.mark.parametrize("files", [{"tokenizer_config.json": json.dumps({"tokenizer_class": "LlamaTokenizer"})},
                                   {"tokenizer.json": "{not json"}], ids=["no-vocabulary", "corrupt"])
def test_unloadable_tokenizer_fails_at_start_up_naming_the_files(tmp_path, files):
    path = make_llama_checkpoint(str(tmp_path / "m"))
    for name, text in files.items():
        (tmp_path / "m" / name).write_text(text)
    proc = run_kc("serve", path, "--port", "0", check=False, timeout=120)
    assert proc.returncode != 0
    message = proc.stderr
    assert "cannot load the tokenizer" in message and all(name in message for name in files)
    if "tokenizer.json" not in files:
        assert "Missing: a vocabulary file" in message
    assert "Starting the engine" not in message  # refused before any engine process started


def test_checkpoint_without_tokenizer_files_fails_at_start_up_unless_token_ids_are_asked_for(tmp_path):
    """Not a warning followed by a server that cannot read text: the message lists what the directory holds,
    names the missing vocabulary and the flag that serves token-id prompts only."""
    path = make_llama_checkpoint(str(tmp_path / "m"))
    proc = run_kc("serve", path, "--port", "0", check=False, timeout=600)  # a safety net only
    assert proc.returncode != 0
    message = " ".join(proc.stderr.split())
    assert f"no tokenizer in {path}: found config.json" in message and "model.safetensors" in message
    assert "Missing: a vocabulary file (tokenizer.json" in message and "--skip-tokenizer-init" in message
    assert "Starting the engine" not in message and "Traceback" not in message


def test_llm_without_tokenizer_files_serves_token_ids(tmp_path, caplog):
    from kernelcore import SamplingParams
    from kernelcore.engine.llm import LLM

    path = make_llama_checkpoint(str(tmp_path / "m"))
    llm = LLM(path, kv_cache_memory=1 << 20, skip_tokenizer_init=True)
    try:
        assert llm.tokenizer is None and not [r for r in caplog.records if "No tokenizer files" in r.getMessage()]
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=3),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3 and not out[0].outputs[0].text
        with pytest.raises(Exception, match="(?i)tokenizer"):
            llm.generate(["some text"], SamplingParams(max_tokens=1), use_tqdm=False)
    finally:
        llm.shutdown()
