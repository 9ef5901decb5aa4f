"""What a GGUF file says about itself, parsed once per file and kept on disk: the transformers config and tokenizer
its metadata describe, and its tensor table (name, type, shape, byte offset).

gguf's reader and transformers' GGUF support turn every vocabulary entry into Python objects: for a 262k-token
vocabulary that is about half a minute, and every process of a server (front end, engine core, each worker) would
pay it. The first process to open a file writes the results to ``$KC_CACHE_DIR/gguf/<key>/`` (key: the file's
real path, size and modification time), through a temporary directory renamed into place, so a concurrent
process either finds a complete entry or writes its own; later ones read plain JSON and tokenizer files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

FORMAT = 2  # bump when what is cached changes


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # "F32", "Q4_K", ...
    shape: tuple[int, ...]  # PyTorch order (rows first)
    offset: int  # of its data, from the start of the file
    nbytes: int


def cache_root() -> str:
    root = os.environ.get("KC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kernelcore")
    return os.path.join(root, "gguf")


def _key(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    return hashlib.sha256(f"{FORMAT}:{real}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]


def _write(path: str, target: str) -> None:
    """Parse ``path`` with gguf and transformers (the slow way) into the directory ``target``."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    reader = gguf.GGUFReader(path, "r")
    fields = reader.fields
    arch_field = fields.get("general.architecture")
    tensors = [{"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in reversed(t.shape)],
                "offset": int(t.data_offset), "nbytes": int(t.n_bytes)} for t in reader.tensors]
    scalars = {}
    for key, field in fields.items():  # the model's own keys (rope, windows, soft-capping); not the vocabulary
        if not key.startswith(("tokenizer.", "GGUF.")) and len(field.types) == 1 \
                and field.types[0] != gguf.GGUFValueType.ARRAY:
            scalars[key] = field.contents()
    info = {"architecture": arch_field.contents() if arch_field is not None else None,
            "has_vocabulary": "tokenizer.ggml.model" in fields, "metadata": scalars, "tensors": tensors}
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(target))
    try:
        with open(os.path.join(tmp, "gguf.json"), "w") as f:
            json.dump(info, f)
        if info["architecture"] is not None:
            directory, name = os.path.dirname(path), os.path.basename(path)
            try:
                config = AutoConfig.from_pretrained(directory, gguf_file=name, trust_remote_code=False)
                config.save_pretrained(tmp)
            except ValueError as exc:  # transformers: "GGUF model with architecture X is not supported yet."
                with open(os.path.join(tmp, "config-error.txt"), "w") as f:
                    f.write(str(exc))
            if info["has_vocabulary"]:
                AutoTokenizer.from_pretrained(directory, gguf_file=name, trust_remote_code=False).save_pretrained(
                    os.path.join(tmp, "tokenizer"))
        try:
            os.rename(tmp, target)
        except OSError:  # another process got there first: its entry is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@functools.lru_cache(maxsize=8)
def cached_dir(path: str) -> str:
    """The cache directory of ``path``'s metadata, written on first use."""
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    target = os.path.join(root, _key(path))
    if not os.path.isfile(os.path.join(target, "gguf.json")):
        _write(path, target)
    return target


@functools.lru_cache(maxsize=8)
def _info(path: str) -> dict:
    with open(os.path.join(cached_dir(path), "gguf.json")) as f:
        return json.load(f)


def architecture(path: str) -> str | None:
    return _info(path)["architecture"]


def metadata(path: str) -> dict:
    """The file's scalar metadata (``llama.rope.freq_base``: 10000.0, ...), vocabulary arrays left out."""
    return dict(_info(path)["metadata"])


def has_vocabulary(path: str) -> bool:
    return bool(_info(path)["has_vocabulary"])


def tensors(path: str) -> list[TensorInfo]:
    return [TensorInfo(t["name"], t["type"], tuple(t["shape"]), t["offset"], t["nbytes"])
            for t in _info(path)["tensors"]]


def config_dir(path: str) -> tuple[str, str | None]:
    """(directory holding config.json, or transformers' reason it could not describe the file)."""
    directory = cached_dir(path)
    error = os.path.join(directory, "config-error.txt")
    if os.path.isfile(error):
        with open(error) as f:
            return directory, f.read()
    return directory, None


def tokenizer_dir(path: str) -> str | None:
    directory = os.path.join(cached_dir(path), "tokenizer")
    return directory if os.path.isdir(directory) else None
