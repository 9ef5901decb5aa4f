"""kernelcore: a plugin-first LLM inference server.

``import kernelcore`` is cheap: it neither resolves the platform nor loads plugins.
"""

from kernelcore.contract import CONTRACT_VERSION, require_contract
from kernelcore.contract.hookspecs import hookimpl, hookspec

__version__ = "0.1.0"
__all__ = ["CONTRACT_VERSION", "hookimpl", "hookspec", "require_contract", "LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from kernelcore.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kernelcore.core_types.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'kernelcore' has no attribute {name!r}")
