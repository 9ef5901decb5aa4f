from kernelcore import hookimpl


@hookimpl
def register_models(registry):
    # The string form imports nothing until a checkpoint with this architecture is served.
    registry.register_model("NovaLMForCausalLM", "nova_kc.models.nova_lm:NovaLMForCausalLM")
