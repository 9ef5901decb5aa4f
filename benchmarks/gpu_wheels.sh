#!/usr/bin/env bash
# Download, here, the wheels the GPU image lacks (it has torch, triton, transformers, aiohttp, pluggy, ... but
# no package index), for benchmarks/gpu_check.sh to install there: the given packages (default: kernelcore's
# dependencies the image does not list, and the openai client of the serve check) with everything they require,
# at the versions installed here, for CPython 3.12 on x86-64 Linux. Carry the folder as `.whl` (it is ignored).
# Usage: benchmarks/gpu_wheels.sh [package ...]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
python - "${@:-msgspec setproctitle openai}" <<'PY' | while read -r spec; do
import importlib.metadata as md
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement

env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_machine": "x86_64", "extra": ""}
todo, seen = " ".join(sys.argv[1:]).split(), {}
while todo:
    name = todo.pop()
    key = name.lower().replace("_", "-")
    if key in seen:
        continue
    seen[key] = md.version(name)
    for req in map(Requirement, md.requires(name) or []):
        if req.marker is None or req.marker.evaluate(env):
            todo.append(req.name)
for name, version in sorted(seen.items()):
    print(f"{name}=={version}")
PY
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec" 2> >(grep -v "is ignored: it is neither" >&2) || echo "no wheel for $spec" >&2
done
ls .whl
du -sh .whl
