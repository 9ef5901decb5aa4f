"""LoRA: PEFT adapter loading, batched multi-adapter linears, the worker's slot manager, resolvers."""

from kernelcore.lora.serving import LoRARequest

__all__ = ["LoRARequest"]
