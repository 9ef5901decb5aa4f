"""The built-in model architectures (entry point ``models`` in kernelcore.general_plugins)."""

from kernelcore import hookimpl

# architecture -> "module:class"; the string form imports a model module only when its architecture is asked for
ARCHITECTURES = {
    "OPTForCausalLM": "builtin_plugins.models.opt:OPTForCausalLM",
    "LlamaForCausalLM": "builtin_plugins.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "builtin_plugins.models.qwen:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "builtin_plugins.models.qwen:Qwen3ForCausalLM",
    "MistralForCausalLM": "builtin_plugins.models.mistral:MistralForCausalLM",
    "Phi3ForCausalLM": "builtin_plugins.models.phi3:Phi3ForCausalLM",
    "Gemma3ForCausalLM": "builtin_plugins.models.gemma3:Gemma3ForCausalLM",
    "Qwen3MoeForCausalLM": "builtin_plugins.models.qwen3_moe:Qwen3MoeForCausalLM",
    "MixtralForCausalLM": "builtin_plugins.models.mixtral:MixtralForCausalLM",
}


@hookimpl
def register_models(registry) -> None:
    for architecture, target in ARCHITECTURES.items():
        registry.register_model(architecture, target)
