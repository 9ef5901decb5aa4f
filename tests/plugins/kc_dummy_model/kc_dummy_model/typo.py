"""A plugin with a misspelled hook name (register_model) when KC_DUMMY_TYPO_HOOK=1."""

import os

from kernelcore import hookimpl

if os.environ.get("KC_DUMMY_TYPO_HOOK") == "1":
    @hookimpl
    def register_model(registry):
        raise AssertionError("a hook with a misspelled name must never be called")
