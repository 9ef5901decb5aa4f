"""The hook specifications, kept importable here: they live in :mod:`kernelcore.contract.hookspecs`."""

from kernelcore.contract.hookspecs import *  # noqa: F403 (re-exported: every hook and both markers)
from kernelcore.contract.hookspecs import hookimpl, hookspec

__all__ = ["hookimpl", "hookspec"]
