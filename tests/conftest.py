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
# which a test running beside them would disturb). Unset: every test, in this process, in file order.
PHASES = ("parallel", "exclusive")


def _module(item) -> str:
    return item.nodeid.split("::")[0]


def _split_phase(config, items) -> None:
    """Keep the phase's tests, deselect the others; in the parallel phase, the heaviest modules first.

    The parallel phase runs with ``--dist loadscope --no-loadscope-reorder``: a module's tests stay on one worker
    (its module-scoped servers and caches start once) and modules are handed out in the order of the items. A
    module's weight is its `slow` tests (each starts processes or reads a real model) plus a little per other
    test, so the long modules start first and the short ones fill in at the end, instead of one long module
    starting when the other worker has nothing left to do."""
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
    if phase == "parallel":
        weight: dict[str, float] = {}
        for item in keep:
            weight[_module(item)] = weight.get(_module(item), 0.0) + (1.0 if item.get_closest_marker("slow") else 0.05)
        keep.sort(key=lambda item: -weight[_module(item)])  # stable: each module's tests keep their order
    items[:] = keep


def pytest_configure(config):
    missing = _missing_dummies()
    config._kc_missing_dummies = missing
    if missing and _is_ci():  # CI must run everything: a missing dummy is a broken set-up, not a skip
        raise pytest.UsageError(f"dummy plugin packages not installed: {missing}; run the README's test command "
                                f"(scripts/test.sh pip-installs tests/plugins/*)")


def pytest_collection_modifyitems(config, items):
    """Split the run into its phase (above), then: without every dummy package (a contributor's quick run), skip
    the modules that use them."""
    _split_phase(config, items)
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
