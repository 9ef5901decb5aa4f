"""The CPU platform's native kernel libraries (builtin_plugins/cpu/native.py): one build per cache key however
many processes start together, and a library that cannot be built or loaded reported as missing (why, and what
runs instead) through ``report_components``, never a silent fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builtin_plugins.cpu import native

pytestmark = pytest.mark.skipif(not (os.environ.get("CXX") or native.shutil.which("g++")),
                                reason="no C++ compiler")

# Waits for the go file, builds and loads the pointwise library, waits until every process has loaded it, then
# prints the paths its mappings name.
BUILD_AND_MAP = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from pathlib import Path
    from builtin_plugins.cpu import native, pointwise
    go, count = Path(sys.argv[1]), int(sys.argv[2])
    while not go.exists():
        time.sleep(0.001)
    ctypes.CDLL(str(native.build_library(pointwise.SOURCE)))
    (go.parent / f"loaded-{os.getpid()}").touch()
    while len(list(go.parent.glob("loaded-*"))) < count:
        time.sleep(0.001)
    maps = [line.split(None, 5)[-1].strip() for line in open("/proc/self/maps") if "pointwise-" in line]
    print(json.dumps(maps))
""")


def test_processes_building_together_load_one_library(tmp_path):
    """Four processes released together on an empty cache: one compiles, the others wait for it and load the same
    file. (Before the build lock each compiled and replaced the file, so a process that had loaded an earlier
    copy mapped a deleted file: the kernels were resident twice and /proc/self/maps named no library.)"""
    env = dict(os.environ, KC_CACHE_DIR=str(tmp_path / "cache"))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_AND_MAP, str(go), "4"], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    go.touch()
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    mapped = [json.loads(out) for out in outputs]
    paths = {path for maps in mapped for path in maps}
    assert len(paths) == 1 and not any("(deleted)" in path for path in paths), mapped
    libraries = list((tmp_path / "cache" / "cpu-kernels").glob("pointwise-*.so"))
    assert [str(p) for p in libraries] == list(paths)


REPORT = textwrap.dedent("""
    import json
    from builtin_plugins.cpu.components import native_components
    print(json.dumps(native_components()))
""")


def report(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", REPORT], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=600, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_a_library_that_cannot_be_built_is_reported_missing(tmp_path):
    """A failing compiler in a fresh cache: every library is "missing" with the compiler's failure and the torch
    fallback named; the same machine with its compiler reports each "ok" with the instruction set."""
    broken = report({"KC_CACHE_DIR": str(tmp_path / "broken"), "CXX": "/bin/false"})
    names = {"cpu.gguf_matmul", "cpu.paged_attention", "cpu.pointwise", "cpu.small_gemm"}
    assert set(broken) == names
    for status in broken.values():
        assert status.startswith("missing: ") and "/bin/false" in status and "torch ops" in status, status
    off = report({"KC_CPU_NATIVE_KERNELS": "0"})
    assert all(status.startswith("missing: KC_CPU_NATIVE_KERNELS=0") for status in off.values()), off
    working = report({})
    assert set(working) == names
    for status in working.values():
        assert status.startswith("ok: ") and native.kernel_isa() in status, status


@pytest.mark.slow
def test_avx2_kernels_build_apart_from_native(tmp_path):
    """KC_CPU_KERNEL_ISA=avx2 compiles without AVX-512 (another cache key, reported as avx2), so an AVX-512
    machine can run an AVX2-only CPU's kernel paths."""
    if "avx2" not in native.cpu_flags():
        pytest.skip("needs an AVX2 CPU")
    env = {"KC_CACHE_DIR": str(tmp_path / "cache"), "KC_CPU_KERNEL_ISA": "avx2"}
    status = report(env)
    assert all(s.startswith("ok: ") and ", avx2" in s and "avx512" not in s for s in status.values()), status
    assert "vpmaddubsw" in status["cpu.gguf_matmul"] or "avxvnni" in status["cpu.gguf_matmul"]
    assert len(list(Path(tmp_path / "cache" / "cpu-kernels").glob("gguf_matmul-*.so"))) == 1


@pytest.mark.slow
def test_kc_plugins_shows_each_library_and_a_missing_one_with_its_reason(tmp_path):
    from tests.helpers import run_kc

    report = json.loads(run_kc("plugins", "--json").stdout)
    assert set(report["components"]) == {"cpu.gguf_matmul", "cpu.paged_attention", "cpu.pointwise",
                                         "cpu.small_gemm"}
    assert all(status.startswith("ok: ") for status in report["components"].values()), report["components"]
    text = run_kc("plugins", KC_CACHE_DIR=str(tmp_path), CXX="/bin/false").stdout
    line = next(line for line in text.splitlines() if line.strip().startswith("cpu.gguf_matmul"))
    assert "missing: " in line and "/bin/false" in line and "torch ops" in line
