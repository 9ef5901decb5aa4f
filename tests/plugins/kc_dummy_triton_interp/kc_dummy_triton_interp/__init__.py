"""A test-only platform that runs the Triton attention backend and kernels on CPU tensors through
Triton's interpreter. Its 'device' is present when KC_TRITON_INTERP=1."""

import os

from kernelcore import hookimpl


@hookimpl
def detect_platform():
    if os.environ.get("KC_TRITON_INTERP") == "1":
        return "kc_dummy_triton_interp.platform.TritonInterpPlatform"
    return None
