"""The built-in model architectures (entry point ``models`` in kernelcore.general_plugins)."""

from kernelcore import hookimpl


@hookimpl
def register_models(registry) -> None:
    # String form: a model module is imported only when its architecture is asked for.
    registry.register_model("OPTForCausalLM", "builtin_plugins.models.opt:OPTForCausalLM")
    registry.register_model("LlamaForCausalLM", "builtin_plugins.models.llama:LlamaForCausalLM")
