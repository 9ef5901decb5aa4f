import importlib.metadata as md
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

REQUIRED_DUMMIES = ("kc-dummy-platform", "kc-dummy-model", "kc-dummy-ops", "kc-dummy-stat-logger",
                    "kc-dummy-triton-interp", "kc-dummy-executor", "kc-dummy-structured")
INSTALL = "pip install --no-deps --no-build-isolation ./tests/plugins/kc_dummy_*"


def _missing_dummies() -> list[str]:
    missing = []
    for dist in REQUIRED_DUMMIES:
        try:
            md.distribution(dist)
        except md.PackageNotFoundError:
            missing.append(dist)
    return missing


def _is_ci() -> bool:
    # scripts/test.sh (what CI runs) sets KC_REQUIRE_DUMMIES=1; CI=true does too.
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes") for v in ("KC_REQUIRE_DUMMIES", "CI"))


# scripts/test.sh runs the suite in two phases: KC_TEST_PHASE=parallel (pytest-xdist workers, every test but the
# `exclusive` ones) then KC_TEST_PHASE=exclusive (those alone: they measure the machine's load or compare timings,
# which a test running beside them would disturb). Unset: every test, in this process.
PHASES = ("parallel", "exclusive")


def _share_and_split(config, items) -> None:
    """One pytest-xdist group per module (its module-scoped servers and caches start once), and one for every test
    on the session's SmolLM2 server (one server for all of them); then the phase's tests are kept, the others
    deselected."""
    for item in items:
        uses_smollm2 = "smollm2_server" in getattr(item, "fixturenames", ())
        item.add_marker(pytest.mark.xdist_group("smollm2" if uses_smollm2 else item.nodeid.split("::")[0]))
    phase = os.environ.get("KC_TEST_PHASE", "")
    if not phase:
        return
    if phase not in PHASES:
        raise pytest.UsageError(f"KC_TEST_PHASE={phase!r}: expected one of {PHASES}")
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("exclusive") is not None) == (phase == "exclusive") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_configure(config):
    missing = _missing_dummies()
    config._kc_missing_dummies = missing
    if missing and _is_ci():  # CI must run everything: a missing dummy is a broken set-up, not a skip
        raise pytest.UsageError(f"dummy plugin packages not installed: {missing}; run the README's test command "
                                f"(scripts/test.sh pip-installs tests/plugins/*)")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Share and split the run (below), then: without every dummy package (a contributor's quick run), skip the
    modules that use them."""
    _share_and_split(config, items)
    missing = config._kc_missing_dummies
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"needs the dummy plugin packages {missing}: {INSTALL}")
    uses_dummies: dict[str, bool] = {}
    for item in items:
        path = str(item.fspath)
        if path not in uses_dummies:
            with open(path) as f:
                uses_dummies[path] = "dummy" in f.read().lower()
        if uses_dummies[path]:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _live_environment():
    """An in-process engine freezes KC_* variables (as in production); each test starts with them live."""
    from kernelcore import envs

    envs.unfreeze()
    yield
    envs.unfreeze()


SMOLLM2_API_KEY = "sk-smollm2-test"


@pytest.fixture(scope="session")
def smollm2_server():
    """One `kc serve` of the real SmolLM2-135M-Instruct (Q4_1 GGUF) for every API family's tests in the run:
    hermes tool calls on, ``--api-key SMOLLM2_API_KEY``. Yields its base URL (``http://127.0.0.1:PORT``)."""
    import real_models
    from test_server_e2e import start_server, stop_server

    path = real_models.real_model("smollm2-135m-instruct-q4_1")
    proc, url = start_server(path, "--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser",
                             "hermes", "--api-key", SMOLLM2_API_KEY, "--served-model-name", "smollm2")
    try:
        yield url
    finally:
        stop_server(proc)
