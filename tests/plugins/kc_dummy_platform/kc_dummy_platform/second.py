"""A second out-of-tree platform, present when KC_DUMMY_SECOND_DEVICE=1 (two-OOT error test)."""

import os

from kernelcore import hookimpl


@hookimpl
def detect_platform():
    if os.environ.get("KC_DUMMY_SECOND_DEVICE") == "1":
        return "kc_dummy_platform.platform.DummyPlatform"
    return None
