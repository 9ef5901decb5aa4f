"""A model plugin: one eager and one lazy architecture. KC_DUMMY_MODEL_RAISE=1 makes it fail."""

import os

from kernelcore import hookimpl


@hookimpl
def register_models(registry):
    if os.environ.get("KC_DUMMY_MODEL_RAISE") == "1":
        raise RuntimeError("dummy model plugin refused to register")
    from kc_dummy_model.my_opt import MyOPTForCausalLM

    registry.register_model("MyOPTForCausalLM", MyOPTForCausalLM)  # eager: inspected now
    registry.register_model("MyLazyLlama", "kc_dummy_model.lazy_llama:MyLazyLlama")  # lazy: imported on demand
    if os.environ.get("KC_DUMMY_OVERRIDE_OPT") == "1":
        registry.register_model("OPTForCausalLM", MyOPTForCausalLM)
