"""The start-up check on a checkpoint's tokenizer (kernelcore.engine.tokenizer.try_get_tokenizer, what `kc serve`,
LLM and AsyncLLM call before any engine process starts): a real word-level vocabulary is accepted even though it
encodes no English probe, and only a tokenizer whose vocabulary is special tokens alone is refused."""

from __future__ import annotations

import pytest

from kernelcore.engine.tokenizer import TokenizerError, regular_vocab_size, try_get_tokenizer


def word_level_checkpoint(path: str, vocab: dict[str, int], **special_tokens: str) -> str:
    """tokenizer.json and tokenizer_config.json of a tokenizers WordLevel model, saved by transformers."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", **special_tokens).save_pretrained(path)
    return path


def test_word_level_vocabulary_without_english_is_accepted(tmp_path):
    path = word_level_checkpoint(str(tmp_path / "fr"), {"[UNK]": 0, "bonjour": 1, "monde": 2})
    tokenizer = try_get_tokenizer(path, required=True)
    assert tokenizer is not None and regular_vocab_size(tokenizer) == 2
    assert tokenizer("bonjour monde", add_special_tokens=False)["input_ids"] == [1, 2]
    assert tokenizer("Hello world", add_special_tokens=False)["input_ids"] == [0, 0]  # the probe the old check used


def test_vocabulary_of_special_tokens_only_is_refused(tmp_path):
    path = word_level_checkpoint(str(tmp_path / "none"), {"[UNK]": 0, "[PAD]": 1, "</s>": 2}, pad_token="[PAD]",
                                 eos_token="</s>")
    with pytest.raises(TokenizerError, match=r"cannot load the tokenizer of .*none: found tokenizer\.json, "
                                             r"tokenizer_config\.json, but the tokenizer it builds encodes no text: "
                                             r"its vocabulary is special tokens only"):
        try_get_tokenizer(path, required=True)
    with pytest.raises(TokenizerError, match="encodes no text"):  # LLM and AsyncLLM call it without required
        try_get_tokenizer(path)
