"""Build llama.cpp's ``llama-server`` from the llama-cpp-python sdist on PyPI, and convert checkpoints to GGUF.

Only the package index is used (``pip download`` of the sdist, which vendors llama.cpp, its converter and gguf-py);
everything is cached under ``$KC_CACHE_DIR/llamacpp`` (default ``~/.cache/kernelcore/llamacpp``).

    python benchmarks/llamacpp_build.py                 # build (or find) llama-server, print its path
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile

DEFAULT_VERSION = "0.3.36"


def cache_dir() -> str:
    root = os.environ.get("KC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kernelcore")
    path = os.path.join(root, "llamacpp")
    os.makedirs(path, exist_ok=True)
    return path


def vendored_source(version: str = DEFAULT_VERSION) -> str:
    """The sdist's vendor/llama.cpp directory, downloaded and unpacked once."""
    root = cache_dir()
    src = os.path.join(root, f"llama_cpp_python-{version}", "vendor", "llama.cpp")
    if os.path.isfile(os.path.join(src, "CMakeLists.txt")):
        return src
    sdists = glob.glob(os.path.join(root, f"llama_cpp_python-{version}.tar.gz"))
    if not sdists:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", root,
                        f"llama-cpp-python=={version}"], check=True)
        sdists = glob.glob(os.path.join(root, f"llama_cpp_python-{version}.tar.gz"))
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(root, filter="data")
    return src


# isa -> ggml's CPU flags: native = what this CPU has; avx2 = an AVX2-only CPU's build (Zen 2/3, Haswell-Skylake
# client parts), to compare the AVX2 paths of both servers on an AVX-512 machine.
ISA_FLAGS = {"native": ["-DGGML_NATIVE=ON"],
             "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                      "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"]}


def build_server(version: str = DEFAULT_VERSION, jobs: int | None = None, tool: str = "llama-server",
                 isa: str = "native") -> str:
    """Path of a ``llama-server`` binary (or another of its tools: ``llama-perplexity``) built for ``isa``
    (ISA_FLAGS: the CPU's own instructions by default), CPU only, nothing fetched at build time."""
    src = vendored_source(version)
    build = os.path.join(cache_dir(), f"build-{version}" + ("" if isa == "native" else f"-{isa}"))
    binary = os.path.join(build, "bin", tool)
    if os.access(binary, os.X_OK):
        return binary
    flags = ["-DCMAKE_BUILD_TYPE=Release", *ISA_FLAGS[isa], "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
             "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON"]
    subprocess.run(["cmake", "-S", src, "-B", build, *flags], check=True)
    subprocess.run(["cmake", "--build", build, "--target", tool, "-j", str(jobs or os.cpu_count() or 1)],
                   check=True)
    return binary


def convert(checkpoint: str, outtype: str, version: str = DEFAULT_VERSION) -> str:
    """GGUF file of ``checkpoint`` in ``outtype`` (f32, bf16, q8_0), made by the vendored convert_hf_to_gguf.py."""
    src = vendored_source(version)
    out = os.path.join(checkpoint, f"model-{outtype}.gguf")
    if os.path.isfile(out):
        return out
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(src, "gguf-py"), src]))
    subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), checkpoint, "--outtype", outtype,
                    "--outfile", out + ".tmp"], check=True, env=env)
    os.rename(out + ".tmp", out)
    return out


if __name__ == "__main__":
    # python benchmarks/llamacpp_build.py [--isa avx2] [TOOL ...]  (tools: llama-server, llama-perplexity)
    args = sys.argv[1:]
    isa = "native"
    if args[:1] == ["--isa"]:
        isa, args = args[1], args[2:]
    for name in args or ["llama-server"]:
        print(build_server(tool=name, isa=isa))
