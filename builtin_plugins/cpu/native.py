"""The CPU platform's native code: each kernel library built with the machine's C++ compiler at first use
(``load_native``), and the decode-attention kernel (csrc/paged_attention.cpp).

The sources in csrc/ include no torch headers, so a build takes about a second; the shared library is cached
under ``$KC_CACHE_DIR/cpu-kernels`` keyed by the source and the headers it may include, the flags, the compiler
and the CPU, and loaded with ctypes. Without a compiler (or with ``KC_CPU_NATIVE_KERNELS=0``) each caller keeps
its torch implementation; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from builtin_plugins.cpu.cpuinfo import cpu_flags, cpu_id
from builtin_plugins.cpu.launch import launch, replay_in_c
from kernelcore import envs

# The thread-count argument of every kernel: "the calling thread's torch.get_num_threads() at the call" (kc_threads
# in csrc/kc_common.h), not the value at recording time, so recorded decode steps follow thread_policy.py.
CURRENT_THREADS = 0

logger = logging.getLogger("kernelcore.cpu")

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
# -ffast-math only when compiling (it lets exp and the float reductions vectorise); linking without it keeps
# crtfastmath.o, which would flush denormals for the whole process, out of the library.
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c++17"]
# KC_CPU_KERNEL_ISA=avx2: every AVX-512 extension off (-mno-avx512f takes the subsets with it; AMX too)
ISA_FLAGS = {"native": [], "avx2": ["-mno-avx512f", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]}
LINK_FLAGS = ["-shared", "-fopenmp"]
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
T = TypeVar("T")
_STATUS: dict[str, str] = {}  # load_native's outcome per library, for report_components


class PagedDecodeKernel:
    """``out = softmax(q k^T * scale) v`` for one query per sequence, K/V read from the paged cache."""

    def __init__(self, library: ctypes.CDLL):
        self._fn = library.kc_paged_decode
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        c_int = ctypes.c_int
        self._fn.argtypes = [c_int, c_int, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, i64,
                             ctypes.c_float, i64, ctypes.c_int]
        self._fn.restype = ctypes.c_int
        self._write = library.kc_write_kv
        self._write.argtypes = [c_int, c_int, ptr, ptr, i64, i64, ptr, ptr, ptr, i64, i64, i64, i64, i64,
                                ctypes.c_int]
        self._write.restype = ctypes.c_int
        replay_in_c(library, self._fn)
        replay_in_c(library, self._write)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """k/v [T, Hkv, D] (token rows may be strided) into their slots of the [num_blocks, Hkv, block_size, D]
        caches (keys transposed per block); a bfloat16 cache takes float32 rows rounded to nearest even."""
        num_tokens, num_kv_heads, head_size = k.shape
        if not (k.dtype == v.dtype and k_cache.dtype == v_cache.dtype and self.supports_dtype(k.dtype, k_cache.dtype)
                and k.shape == v.shape
                and k.stride()[1:] == v.stride()[1:] == (head_size, 1) and k_cache.is_contiguous()
                and v_cache.is_contiguous() and k_cache.shape == v_cache.shape
                and k_cache.shape[1] == num_kv_heads and k_cache.shape[3] == head_size
                and slot_mapping.dtype == torch.int64 and slot_mapping.shape == (num_tokens,)):
            raise ValueError("paged write: keys, values, caches or slot mapping do not match")
        slot_mapping = slot_mapping.contiguous()
        status = launch(self._write, DTYPE_CODES[k.dtype], DTYPE_CODES[k_cache.dtype], k.data_ptr(), v.data_ptr(),
                        k.stride(0), v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(),
                        num_tokens, num_kv_heads, head_size, k_cache.shape[2], k_cache.shape[0], CURRENT_THREADS)
        if status != 0:
            raise ValueError("paged write: slot out of range")

    @staticmethod
    def supports_heads(num_heads: int, num_kv_heads: int) -> bool:
        return num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= 64 and num_heads <= 1024

    @staticmethod
    def supports_dtype(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> bool:
        """Queries (and output) of ``dtype`` over a cache of ``cache_dtype`` (default: the same): float32 or
        bfloat16 alike, or float32 queries over a bfloat16 cache."""
        cache_dtype = cache_dtype or dtype
        return dtype in DTYPE_CODES and (cache_dtype == dtype or (dtype, cache_dtype) == (torch.float32,
                                                                                            torch.bfloat16))

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, sliding_window: int | None = None) -> torch.Tensor:
        """q [B, H, D]; k/v_cache [num_blocks, Hkv, block_size, D] (the key cache's blocks hold each head's
        keys transposed, [D, block_size]: see CpuAttentionBackend); block_tables [B, max_blocks] and seq_lens
        [B] int64 -> [B, H, D]. ``sliding_window``: each query sees its last N positions only (the blocks
        before them are not read, so their table entries may be stale)."""
        # Raw pointers cross into C++: check what would otherwise read out of bounds.
        if not (k_cache.dtype == v_cache.dtype and self.supports_dtype(q.dtype, k_cache.dtype)
                and k_cache.is_contiguous() and v_cache.is_contiguous()
                and k_cache.shape == v_cache.shape and k_cache.shape[3] == q.shape[2]
                and block_tables.dtype == seq_lens.dtype == torch.int64
                and block_tables.shape[0] == seq_lens.shape[0] == q.shape[0]):
            raise ValueError("paged decode: q, caches, block tables or sequence lengths do not match")
        q = q.contiguous()
        block_tables, seq_lens = block_tables.contiguous(), seq_lens.contiguous()
        num_seqs, num_heads, head_size = q.shape
        out = torch.empty_like(q)
        status = launch(self._fn, DTYPE_CODES[q.dtype], DTYPE_CODES[k_cache.dtype], q.data_ptr(), k_cache.data_ptr(),
                        v_cache.data_ptr(), block_tables.data_ptr(), seq_lens.data_ptr(), out.data_ptr(), num_seqs,
                        num_heads, k_cache.shape[1], head_size, k_cache.shape[2], block_tables.shape[1],
                        k_cache.shape[0], scale, sliding_window or 0, CURRENT_THREADS)
        if status == -2:
            raise ValueError("paged decode: a block table points outside the KV cache or is too short")
        if status != 0:
            raise ValueError(f"paged decode: unsupported shape (heads {num_heads}/{k_cache.shape[1]})")
        return out


@functools.cache
def load_paged_decode_kernel() -> PagedDecodeKernel | None:
    """The compiled kernel, or None (logged once) when it cannot be built here."""
    return load_native(SOURCE, PagedDecodeKernel, "decode-attention kernel")


def load_native(source: Path, wrapper: Callable[[ctypes.CDLL], T], what: str) -> T | None:
    """``wrapper`` around the library built from ``source``, or None (logged) with ``KC_CPU_NATIVE_KERNELS=0``
    or where it cannot be built or loaded: the callers keep their torch paths."""
    if not envs.KC_CPU_NATIVE_KERNELS:
        logger.info("KC_CPU_NATIVE_KERNELS=0: the CPU %s is not used (torch ops)", what)
        _STATUS[source.stem] = f"missing: KC_CPU_NATIVE_KERNELS=0; torch ops instead of the {what}"
        return None
    try:
        library = build_library(source)
        loaded = wrapper(ctypes.CDLL(str(library)))
    except Exception as exc:  # no compiler, a failed build, an unloadable library: torch ops still work
        logger.warning("CPU %s unavailable (%s); using torch ops (slower)", what, exc)
        _STATUS[source.stem] = f"missing: {str(exc)[:300]}; torch ops (slower) instead of the {what}"
        return None
    describe = getattr(loaded, "describe", None)
    _STATUS[source.stem] = f"ok: {library.name}, {kernel_isa()}" + (f", {describe()}" if describe else "")
    return loaded


def native_status() -> dict[str, str]:
    """What each ``load_native`` of this process gave: library stem -> "ok: ..." or "missing: <why>"."""
    return dict(_STATUS)


def kernel_isa() -> str:
    """The instruction set the kernels are compiled for: what -march=native gives, or AVX2 where
    ``KC_CPU_KERNEL_ISA=avx2`` leaves AVX-512 out (to measure an AVX2-only CPU's paths on an AVX-512 one)."""
    flags = set(cpu_flags())
    if envs.KC_CPU_KERNEL_ISA == "avx2" or "avx512f" not in flags:
        return "avx2" + ("+avxvnni" if "avx_vnni" in flags else "") if "avx2" in flags else "baseline"
    return "avx512" + "".join(f"+{name}" for name in ("avx512_vnni", "avx512_bf16", "amx_tile") if name in flags)


def build_library(source: Path) -> Path:
    """Compile one torch-free C++ source of csrc/ into a shared library (cached; rebuilt when it changes)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise RuntimeError("no C++ compiler found (install g++ or set CXX)")
    key = hashlib.sha256()
    sources = [path.read_bytes() for path in source_files(source)]  # a changed header is a changed library
    for part in (*sources, " ".join(compile_flags() + LINK_FLAGS).encode(), _compiler_version(compiler).encode(),
                 cpu_id().encode()):
        key.update(part)
    out_dir = Path(envs.KC_CACHE_DIR) / "cpu-kernels"
    library = out_dir / f"{source.stem}-{key.hexdigest()[:16]}.so"
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(out_dir)
    if library.exists():
        check_private(library)
        return library
    # One build per key at a time: processes starting together (workers, test runners) wait for the first
    # build instead of each replacing the file another has already loaded (its mapping would then show as
    # deleted, and two copies of the same code would be resident).
    with open(out_dir / f"{library.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            check_private(library)
            return library
        _compile(compiler, source, out_dir, library)
    logger.info("built the CPU kernel %s: %s", source.name, library)
    return library


def _compile(compiler: str, source: Path, out_dir: Path, library: Path) -> None:
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        obj, tmp_lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        for cmd in ([compiler, *compile_flags(), "-c", str(source), "-o", str(obj)],
                    [compiler, *LINK_FLAGS, str(obj), "-o", str(tmp_lib)]):
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()[-2000:]}")
        tmp_lib.chmod(0o755)  # whatever the umask: check_private refuses group/world-writable files
        os.replace(tmp_lib, library)  # atomic: a reader never sees half a library


def compile_flags() -> list[str]:
    return COMPILE_FLAGS + ISA_FLAGS[envs.KC_CPU_KERNEL_ISA]


def source_files(source: Path) -> list[Path]:
    """What a build of ``source`` depends on: the source and every header of csrc/ (any of which it may include,
    directly or through another header)."""
    return [source, *sorted(source.parent.glob("*.h"))]


def check_private(path: Path) -> None:
    """Loading a library runs its code: refuse one that another user could have planted or replaced."""
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{path} is writable by other users or not owned by this user; refusing to load "
                           "code from it (fix its permissions or point KC_CACHE_DIR elsewhere)")


def _compiler_version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
