"""GGUF checkpoints (llama.cpp's single-file format): config, tokenizer and weights, read with the ``gguf`` package.

The transformers config and tokenizer come from the file's metadata and embedded vocabulary (transformers' own
GGUF support, ``gguf_file=``); nothing is downloaded and no remote code runs. Weights stream tensor by tensor
from the memory-mapped file, renamed to the Hugging Face names the model classes load and tagged with their GGUF
type (``tensor.gguf_type``). Float tensors come as float32; quantized ones as their stored blocks (uint8
[rows, row_bytes], ``tensor.gguf_blocks`` set, see gguf_params.py), which the loader keeps at their size for the
layers whose method computes with blocks. Which GGUF types load at all is the quantization registry's business:
type ``T`` needs a method registered as ``gguf_<t>``; any other is refused at start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch

from kernelcore.models import gguf_metadata

logger = logging.getLogger("kernelcore.models")

QUANTIZATION = "gguf"  # the method a GGUF checkpoint gets when --quantization is not given
# GGUF architectures whose converter permutes the rows of q/k for llama.cpp's rotary layout (undone at load)
PERMUTED_QK = {"llama"}
# GGUF architectures whose converter stores RMSNorm weights as (1 + w): the models here apply (1 + w) themselves
NORM_PLUS_ONE = {"gemma", "gemma2", "gemma3"}
FLOAT_TYPES = {"F32", "F16", "BF16"}


class GGUFError(ValueError):
    """A GGUF file kernelcore cannot serve (an unsupported tensor type, an unknown architecture or tensor)."""


def is_gguf(path: str | None) -> bool:
    return path is not None and path.endswith(".gguf") and os.path.isfile(path)


def method_name(tensor_type: str) -> str:
    """The quantization-registry name that loads GGUF tensors of ``tensor_type`` ("Q8_0" -> "gguf_q8_0")."""
    return f"gguf_{tensor_type.lower()}"


def architecture(path: str) -> str:
    arch = gguf_metadata.architecture(path)
    if arch is None:
        raise GGUFError(f"{path} has no general.architecture: not a model GGUF file")
    return arch


def tensor_types(path: str) -> dict[str, str]:
    """GGUF tensor name -> its type's name ("F32", "Q8_0", ...)."""
    return {t.name: t.type_name for t in gguf_metadata.tensors(path)}


def check_tensor_types(path: str, registered: list[str]) -> None:
    """Raise GGUFError naming the first tensor whose type no registered ``gguf_<type>`` method loads."""
    supported = sorted(name[len("gguf_"):].upper() for name in registered if name.startswith("gguf_"))
    for name, kind in tensor_types(path).items():
        if method_name(kind) not in registered:
            raise GGUFError(f"GGUF tensor {name!r} in {os.path.basename(path)} has type {kind}, which kernelcore "
                            f"cannot load (supported GGUF types: {', '.join(supported)}); a plugin may add it by "
                            f"registering the quantization method {method_name(kind)!r}")


def hf_config(path: str):
    """The transformers config the metadata describes, with ``architectures`` set from its model type."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    gguf_arch = architecture(path)
    directory, error = gguf_metadata.config_dir(path)
    if error is not None:
        raise GGUFError(f"cannot read the config of {path}: {error}")
    config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
    if not getattr(config, "architectures", None):
        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        if arch is None:
            raise GGUFError(f"{path}: no causal-LM class for GGUF model type {config.model_type!r}")
        config.architectures = [arch]
    config.gguf_architecture = gguf_arch
    _complete_config(config, gguf_arch, gguf_metadata.metadata(path))
    return config


# Metadata keys (after "<arch>.") some transformers versions leave out of a GGUF config -> the config attribute
# they set. Applied only to attributes the config class has, so each architecture takes the keys it knows.
METADATA_ATTRIBUTES = {
    "attention.key_length": "head_dim",
    "attention.sliding_window": "sliding_window",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
}


def _complete_config(config, arch: str, metadata: dict) -> None:
    """Fill the attributes the metadata states but transformers' GGUF mapping dropped (Qwen3's head_dim:
    its class default is 128 whatever ``qwen3.attention.key_length`` says)."""
    for key, attribute in METADATA_ATTRIBUTES.items():
        value = metadata.get(f"{arch}.{key}")
        if value is not None and hasattr(config, attribute) and getattr(config, attribute) != value:
            logger.debug("GGUF %s.%s = %r sets %s (transformers had %r)", arch, key, value, attribute,
                         getattr(config, attribute))
            setattr(config, attribute, value)


def tokenizer(path: str):
    """transformers' tokenizer built from the file's embedded vocabulary (None when it embeds none)."""
    from transformers import AutoTokenizer

    directory = gguf_metadata.tokenizer_dir(path)
    return None if directory is None else AutoTokenizer.from_pretrained(directory, trust_remote_code=False)


def hf_names(config) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face parameter name (:func:`_hf_names_here`), computed in a child process and
    kept under ``$KC_CACHE_DIR/gguf-names`` keyed by the config and the library versions. Building transformers'
    model class, even on the meta device, imports its modeling code, torch._dynamo and triton: about 200 MiB that
    a serving process would keep resident for nothing."""
    import hashlib
    import json
    import subprocess
    import sys

    import gguf
    import transformers

    from kernelcore import envs

    body = json.dumps({"config": config.to_dict(), "gguf_architecture": config.gguf_architecture}, sort_keys=True,
                      default=str)
    key = hashlib.sha256("\n".join([body, transformers.__version__, getattr(gguf, "__version__", "")]).encode())
    cache = os.path.join(envs.KC_CACHE_DIR, "gguf-names", f"{key.hexdigest()[:24]}.json")
    try:
        with open(cache) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where kernelcore is
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    child = subprocess.run([sys.executable, "-c", "from kernelcore.models.gguf_checkpoint import _names_main; "
                            "_names_main()"], input=body, capture_output=True, text=True, timeout=600, env=env)
    if child.returncode != 0:
        raise GGUFError(f"mapping the GGUF tensor names failed: {child.stderr.strip()[-2000:]}")
    names = json.loads(child.stdout)
    os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
    tmp = f"{cache}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(names, f)
    os.replace(tmp, cache)  # atomic: processes loading the same model together keep one file
    return names


def _names_main() -> None:
    """The child of :func:`hf_names`: the config as JSON on stdin, the name table as JSON on stdout."""
    import json
    import sys

    from transformers import AutoConfig

    body = json.load(sys.stdin)
    values = dict(body["config"])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    config.gguf_architecture = body["gguf_architecture"]
    json.dump(_hf_names_here(config), sys.stdout)


def _hf_names_here(config) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face parameter name, from the state-dict keys of the config's model (built on
    the meta device, no memory) mapped forward through gguf's own tensor-name table."""
    import gguf
    from transformers import AutoModelForCausalLM

    arch_ids = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    arch = arch_ids.get(config.gguf_architecture)
    if arch is None:
        raise GGUFError(f"gguf does not know the architecture {config.gguf_architecture!r}")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    table = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        gguf_name = table.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is not None:
            names[gguf_name] = hf_name
    return names


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's ``permute``: per head, rows (pairs interleaved) back to (halves concatenated)."""
    rows = weight.shape[0]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def _data(path: str, info: gguf_metadata.TensorInfo):
    import numpy as np

    return np.memmap(path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))


def dequantize(path: str, info: gguf_metadata.TensorInfo) -> torch.Tensor:
    """A GGUF tensor as float32 in PyTorch's layout (rows = outer dimension)."""
    import gguf
    import numpy as np

    data = _data(path, info)
    if info.type_name in ("F32", "F16"):
        array = np.array(data.view(np.float32 if info.type_name == "F32" else np.float16), dtype=np.float32)
    else:
        array = gguf.quants.dequantize(data.reshape(-1, info.nbytes // max(1, _rows(info))),
                                       gguf.GGMLQuantizationType[info.type_name])
    return torch.from_numpy(np.ascontiguousarray(array).reshape(info.shape))


def _rows(info: gguf_metadata.TensorInfo) -> int:
    rows = 1
    for d in info.shape[:-1]:
        rows *= d
    return rows


def stored_blocks(path: str, info: gguf_metadata.TensorInfo) -> torch.Tensor:
    """A quantized GGUF tensor as its blocks, uint8 [rows, row_bytes] (a copy out of the read-only map), tagged
    with ``gguf_blocks`` and its logical ``gguf_shape`` (rows, cols)."""
    import numpy as np

    rows = _rows(info)
    raw = torch.from_numpy(np.array(_data(path, info)).reshape(rows, -1))
    setattr(raw, "gguf_blocks", True)
    setattr(raw, "gguf_shape", (rows, info.shape[-1]))
    return raw


def iterate_weights(path: str, config) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor tagged with ``gguf_type``) for every tensor of the file: float32 for float
    types, the stored blocks (:func:`stored_blocks`) for quantized ones."""
    names = hf_names(config)
    arch = config.gguf_architecture
    size_mb = os.path.getsize(path) / 1e6
    logger.info("Loading weights: 1 GGUF file, %.1f MB, from %s", size_mb, path)
    for tensor in gguf_metadata.tensors(path):
        hf_name = names.get(tensor.name)
        if hf_name is None:
            raise GGUFError(f"GGUF tensor {tensor.name!r} of {os.path.basename(path)} maps to no parameter of "
                            f"{config.architectures[0]}")
        kind = tensor.type_name
        weight = dequantize(path, tensor) if kind in FLOAT_TYPES or len(tensor.shape) < 2 else \
            stored_blocks(path, tensor)
        if arch in PERMUTED_QK and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in hf_name else config.num_key_value_heads
            weight = unpermute_qk(weight, heads)  # whole rows move, so blocks move with them
            if kind not in FLOAT_TYPES:
                setattr(weight, "gguf_blocks", True)
                setattr(weight, "gguf_shape", (weight.shape[0], tensor.shape[-1]))
        if arch in NORM_PLUS_ONE and tensor.name.endswith("norm.weight"):
            weight = weight - 1
        setattr(weight, "gguf_type", kind)  # read by the loader's record_gguf_types
        yield hf_name, weight
