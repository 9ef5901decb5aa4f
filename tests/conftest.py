import importlib.metadata as md
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

REQUIRED_DUMMIES = ("kc-dummy-platform", "kc-dummy-model", "kc-dummy-ops", "kc-dummy-stat-logger",
                    "kc-dummy-triton-interp", "kc-dummy-executor")


def pytest_configure(config):
    missing = []
    for dist in REQUIRED_DUMMIES:
        try:
            md.distribution(dist)
        except md.PackageNotFoundError:
            missing.append(dist)
    if missing:
        raise pytest.UsageError(f"dummy plugin packages not installed: {missing}; run the README's test command "
                                "(it pip-installs tests/plugins/*)")


@pytest.fixture(autouse=True)
def _live_environment():
    """An in-process engine freezes KC_* variables (as in production); each test starts with them live."""
    from kernelcore import envs

    envs.unfreeze()
    yield
    envs.unfreeze()
