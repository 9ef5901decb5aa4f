"""A vendor-style out-of-tree platform. Its 'device' is present when KC_DUMMY_DEVICE=1."""

import os

from kernelcore import hookimpl


@hookimpl
def detect_platform():
    if os.environ.get("KC_DUMMY_DEVICE") == "1":
        return "kc_dummy_platform.platform.DummyPlatform"
    return None
