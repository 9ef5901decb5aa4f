"""Deprecated path of SamplingParams: it moved to kernelcore.core_types.sampling_params (contract 1.1).

The old names keep working, with a KernelcoreDeprecationWarning, until contract 1.2.
"""

from __future__ import annotations

from kernelcore.contract import deprecated_names


def _moved(name: str):
    def get():
        from kernelcore.core_types import sampling_params

        return getattr(sampling_params, name)

    return (f"kernelcore.core_types.sampling_params.{name}", get)


__getattr__ = deprecated_names(__name__, {name: _moved(name) for name in ("SamplingParams", "MAX_SEED")},
                               removed_in="1.2")
