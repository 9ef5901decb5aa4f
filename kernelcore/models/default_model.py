"""The embedded default model: a small random-weight Llama in real HF format, generated on first use.

Deterministic (fixed seed, embedded training text for the tokenizer) and written atomically into
``$KC_CACHE_DIR/default-model-v1``, so nothing is downloaded. Its weights are random: it exercises
the server end to end but produces no meaningful text. Point ``--model`` at a real local checkpoint
(e.g. facebook/opt-125m or TinyLlama downloaded with ``huggingface-cli download``) for real output.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile

from kernelcore import envs

logger = logging.getLogger("kernelcore.models")

NAME = "default-model-v1"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker.
Every morning he opened the shutters of his shop, wound the clocks on the walls, and greeted the people
who passed by on their way to the market. The children loved to watch the tiny gears turn and the
brass pendulums swing from side to side. In the evening, when the sun went down behind the hills, he
would sit by the window and write letters to his daughter, who lived in the city across the river.
Science is the systematic study of the structure and behaviour of the physical and natural world through
observation and experiment. Mathematics is the language in which the laws of nature are written: numbers,
shapes, patterns, and the relations between them. Computers follow instructions, one after another, and
a program is nothing more than a careful list of such instructions. Language models read text as a
sequence of tokens and learn to predict which token is likely to come next.
What is the capital of France? The capital of France is Paris. How many days are there in a week?
There are seven days in a week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday.
The months of the year are January, February, March, April, May, June, July, August, September,
October, November and December. Water boils at one hundred degrees Celsius at sea level, and it freezes
at zero degrees. The Earth orbits the Sun once a year, and the Moon orbits the Earth about once a month.
Hello! How are you today? I am fine, thank you. Could you please help me with my homework? Of course,
I would be happy to help. Please tell me what you need, and I will do my best to answer your question.
Thank you very much for your help. You are welcome. Have a nice day, and see you tomorrow.
Cooking is both an art and a science. To bake bread you need flour, water, salt and yeast. Mix them,
knead the dough, let it rise in a warm place, shape the loaf and bake it until the crust is golden brown.
A good cup of tea needs fresh water, a warm pot and a little patience while the leaves steep.
The history of the world is a long story of people, cities, empires, inventions and ideas. Writing was
invented thousands of years ago; printing made books cheap; the telegraph, the telephone, the radio and
the internet each made the world a little smaller. Today information travels around the planet in less
than a second, and anyone with a computer can ask questions and receive answers in many languages.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 100 365 1000 2024. \
Punctuation: , . ; : ! ? ' " ( ) [ ] { } - _ / + = * & % $ # @.
def main(): print("hello, world") return 0 # code, lists, dicts, strings and functions.
"""


def default_model_dir() -> str:
    return os.path.join(envs.KC_CACHE_DIR, NAME)


def ensure_default_model() -> str:
    """The default model's directory, generating it first if this is its first use (safe under races)."""
    path = default_model_dir()
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    logger.info("First use of the embedded default model: generating it (random weights, about 13 MB, nothing "
                "downloaded) into %s", path)
    tmp = tempfile.mkdtemp(prefix=f".{NAME}.tmp-", dir=os.path.dirname(path))
    try:
        _write_model(tmp)
        os.rename(tmp, path)  # atomic; fails when another process won the race
    except OSError:
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def describe(path: str) -> str:
    """The start-up notice for the default model: where it lives and what its answers are worth."""
    return (f"Using the embedded default model at {path}. Its weights are random: it answers with random "
            "text by design (it exercises the whole server). For real answers pass a local Hugging Face "
            "checkpoint directory, e.g. `kc serve /path/to/opt-125m`.")


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, min_frequency=1, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", additional_special_tokens=SPECIAL_TOKENS[4:],
                                   chat_template=CHAT_TEMPLATE, model_max_length=2048)


def _write_model(path: str) -> None:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-shard "Writing model shards" bar says nothing the log line does not
    try:
        _write_model_files(path)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _write_model_files(path: str) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>")}
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=ids["<s>"],
                         eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"], dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # wider than the default init: logits are not flat
            if "norm" not in name:
                p.normal_(0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"]).save_pretrained(path)
    tokenizer.save_pretrained(path)
    tokenizer_config = os.path.join(path, "tokenizer_config.json")
    with open(tokenizer_config) as f:
        data = json.load(f)
    data["chat_template"] = CHAT_TEMPLATE  # also here, for readers that only look at tokenizer_config.json
    with open(tokenizer_config, "w") as f:
        json.dump(data, f, indent=2)
