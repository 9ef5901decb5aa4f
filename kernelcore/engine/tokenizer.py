"""Tokenizer loading and chat templates (transformers' own machinery)."""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=4)
def get_tokenizer(path: str):
    from transformers import AutoTokenizer

    import kernelcore.models.gguf_checkpoint as gguf_checkpoint

    if gguf_checkpoint.is_gguf(path):  # the vocabulary embedded in the file
        tokenizer = gguf_checkpoint.tokenizer(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    # kernelcore checks every prompt against max_model_len itself (a clear 400); transformers' "Token indices
    # sequence length is longer than the specified maximum" warning would be false here. This is the flag
    # transformers sets once it has warned, so it stays quiet without touching any logger.
    tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def apply_chat_template(tokenizer, messages: list[dict[str, Any]], chat_template: str | None = None,
                        add_generation_prompt: bool = True, **kwargs: Any) -> str:
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("The tokenizer has no chat template and none was given; pass chat_template=... "
                         "(a Jinja template string)")
    return tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def encode_chat(tokenizer, messages: list[dict[str, Any]], chat_template: str | None = None,
                add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
    text = apply_chat_template(tokenizer, messages, chat_template, add_generation_prompt, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def eos_token_id(tokenizer, hf_config=None) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is None and hf_config is not None:
        eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos


# What transformers reads a tokenizer from: vocabulary files (any one of them, or vocab.json with merges.txt)
# and the files that only configure one.
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "tekken.json", "vocab.json", "merges.txt",
               "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


class TokenizerError(RuntimeError):
    """A checkpoint ships tokenizer files that cannot be loaded: serving it would not read text."""


def tokenizer_files(path: str) -> list[str]:
    import glob
    import os

    names = [n for n in VOCAB_FILES + CONFIG_FILES if os.path.isfile(os.path.join(path, n))]
    return names + sorted(os.path.basename(f) for f in glob.glob(os.path.join(path, "*.tiktoken")))


def try_get_tokenizer(path: str | None, required: bool = False):
    """The tokenizer; None for a checkpoint with no tokenizer files at all (token-id prompts only, no text),
    which is an error when ``required`` (``kc serve`` without --skip-tokenizer-init).

    Raises TokenizerError naming the files found and what is missing when there are tokenizer files but
    none of them loads (a missing library, a vocabulary-less tokenizer_config.json, a corrupt file)."""
    import logging
    import os

    if path is None:  # a config not built by build_config (which always sets model.model)
        return None
    import kernelcore.models.gguf_checkpoint as gguf_checkpoint
    from kernelcore.models import gguf_metadata

    if gguf_checkpoint.is_gguf(path) and not gguf_metadata.has_vocabulary(path):
        if required:
            raise TokenizerError(f"{path} embeds no vocabulary: pass --tokenizer DIR (Hugging Face tokenizer files), "
                                 "or --skip-tokenizer-init to serve token-id prompts only.")
        logging.getLogger("kernelcore.engine").warning(
            "%s embeds no vocabulary and no --tokenizer was given: only token-id prompts work and outputs have no "
            "text", path)
        return None
    found = tokenizer_files(path) if os.path.isdir(path) else []
    if os.path.isdir(path) and not found:
        looked_for = ", ".join(VOCAB_FILES[:3]) + ", *.tiktoken, ..."
        if required:
            present = sorted(os.listdir(path))
            raise TokenizerError(
                f"no tokenizer in {path}: found {', '.join(present) or 'an empty directory'}, none of them a "
                f"tokenizer file. Missing: a vocabulary file ({looked_for}). Add the checkpoint's tokenizer "
                "files, or pass --skip-tokenizer-init to serve token-id prompts only.")
        logging.getLogger("kernelcore.engine").warning(
            "No tokenizer files in %s (looked for %s): only token-id prompts work and outputs have no text",
            path, looked_for)
        return None
    has_vocab = not os.path.isdir(path) or any(n in VOCAB_FILES or n.endswith(".tiktoken") for n in found)
    missing = "" if has_vocab else (" Missing: a vocabulary file (tokenizer.json, tokenizer.model, vocab.json with "
                                    "merges.txt, vocab.txt or *.tiktoken).")
    try:
        tokenizer = get_tokenizer(path)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(f"cannot load the tokenizer of {path}: found {', '.join(found) or 'no files'}.{missing} "
                             f"transformers said: {reason}") from exc
    # transformers builds a tokenizer of special tokens only from a bare tokenizer_config.json: refuse it too. Only
    # that: a real vocabulary need not encode any given probe (a word-level one maps English words to its unknown
    # token).
    if not has_vocab or not regular_vocab_size(tokenizer):
        raise TokenizerError(f"cannot load the tokenizer of {path}: found {', '.join(found)}, but the tokenizer it "
                             f"builds encodes no text: its vocabulary is special tokens only.{missing}")
    return tokenizer


def regular_vocab_size(tokenizer) -> int:
    """How many of the tokenizer's tokens are neither special nor added (the vocabulary proper)."""
    try:
        vocab = set(tokenizer.get_vocab())
    except NotImplementedError:  # a tokenizer class that cannot list its vocabulary: count it
        return len(tokenizer)
    special = set(getattr(tokenizer, "all_special_tokens", None) or [])
    added = set(getattr(tokenizer, "get_added_vocab", dict)())
    return len(vocab - special - added)
