"""LoRA: PEFT adapter loading, batched multi-adapter linears, the worker's slot manager, resolvers."""
