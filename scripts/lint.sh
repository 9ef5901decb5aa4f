#!/usr/bin/env bash
# Lint and type-check the tree (configured in pyproject.toml): ruff, then mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check .
python -m mypy
