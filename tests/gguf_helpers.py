"""Write GGUF files from a transformers checkpoint with gguf.GGUFWriter and gguf.quants, as llama.cpp's
convert_hf_to_gguf.py lays them out (names from gguf's tensor-name table, Llama's q/k rows permuted for
llama.cpp's rotary layout, 1-D tensors kept F32), since CI has no llama.cpp source to run the converter itself.

The reference a test compares kernelcore with is transformers reading the same file (``gguf_file=``): its own
GGUF reader, name mapping and inverse permutation, independent of kernelcore's."""

from __future__ import annotations

import os

import numpy as np
import torch


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: each head's two rotary halves interleaved row by row."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def add_llama_vocab(writer, tokenizer_dir: str) -> None:
    """The checkpoint's byte-fallback BPE vocabulary as a "llama" (SentencePiece-style) GGUF vocabulary."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    tokens = [t for t, _ in vocab]
    special = {tok.bos_token_id, tok.eos_token_id}
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.UNKNOWN if i == tok.unk_token_id
             else gguf.TokenType.BYTE if t.startswith("<0x") else gguf.TokenType.NORMAL for t, i in vocab]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_unk_token_id(tok.unk_token_id)
    writer.add_pad_token_id(tok.unk_token_id)


def random_q6_k(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Valid Q6_K blocks (gguf cannot quantize to K-quants): random 6-bit values and int8 sub-block scales, the
    float16 super-block scale set so weights stay within about +-0.4. Other such types get zero bytes (enough
    for a file that is refused before its tensors are read)."""
    import gguf

    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, gguf.quants.quant_shape_to_byte_shape(shape, gguf.GGMLQuantizationType.Q6_K),
                       dtype=np.uint8)
    blocks = raw.reshape(-1, 210)
    blocks[:, 208:210] = np.frombuffer(np.float16(1e-4).tobytes(), dtype=np.uint8)
    return raw


def write_gguf(checkpoint: str, out: str, qtype: str = "F32", with_vocab: bool = True,
               override_types: dict[str, str] | None = None) -> str:
    """``checkpoint`` (a Llama/Mistral/Qwen2 safetensors directory) as one GGUF file; 2-D weights in ``qtype``
    (F32, F16, BF16, Q8_0, Q4_0); ``override_types``: GGUF tensor name -> a type to store it as instead."""
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(checkpoint)
    arch_name = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                 "phi3": "phi3"}[config.model_type]
    arch = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}[arch_name]
    table = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    writer = gguf.GGUFWriter(out, arch_name)
    writer.add_name(os.path.basename(checkpoint))
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if with_vocab:
        add_llama_vocab(writer, checkpoint)

    tensors = load_file(os.path.join(checkpoint, "model.safetensors"))
    for hf_name, tensor in tensors.items():
        name = table.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        array = tensor.to(torch.float32).numpy()
        if arch_name == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in hf_name else config.num_key_value_heads
            array = permute_qk(array, heads)
        kind = (override_types or {}).get(name, qtype if array.ndim == 2 else "F32")
        if kind == "F32":
            writer.add_tensor(name, np.ascontiguousarray(array))
        elif kind == "F16":
            writer.add_tensor(name, array.astype(np.float16))
        else:
            qt = gguf.GGMLQuantizationType[kind]
            try:
                data = gguf.quants.quantize(array, qt)
            except (gguf.quants.QuantError, NotImplementedError):
                data = random_q6_k(array.shape) if kind == "Q6_K" else \
                    np.zeros(gguf.quants.quant_shape_to_byte_shape(array.shape, qt), dtype=np.uint8)
            writer.add_tensor(name, data, raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def add_tokenizer(path: str, vocab_size: int) -> None:
    """A Llama-style byte-fallback BPE tokenizer over the whole vocabulary (ids 3..258 the bytes, then words)."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for i in range(len(vocab), vocab_size):
        vocab[f"\u2581w{i}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)
