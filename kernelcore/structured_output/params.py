"""The constraint a request asks for, kept importable here: it lives in
:mod:`kernelcore.contract.structured_output_params`."""

from kernelcore.contract.structured_output_params import KINDS, MAX_JSON_WHITESPACE, StructuredOutputsParams

__all__ = ["KINDS", "MAX_JSON_WHITESPACE", "StructuredOutputsParams"]
