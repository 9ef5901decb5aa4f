"""A detector that raises when KC_DUMMY_BROKEN_DETECTOR=1 (it must count as inactive)."""

import os

from kernelcore import hookimpl


@hookimpl
def detect_platform():
    if os.environ.get("KC_DUMMY_BROKEN_DETECTOR") == "1":
        raise RuntimeError("dummy detector exploded")
    return None
