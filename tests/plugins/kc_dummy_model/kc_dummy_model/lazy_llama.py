from builtin_plugins.models.llama import LlamaForCausalLM

IMPORTED = True


class MyLazyLlama(LlamaForCausalLM):
    pass
