"""The built-in LoRA resolvers (entry point ``lora`` in kernelcore.general_plugins).

``filesystem`` serves ``$KC_LORA_RESOLVER_DIR/<name>``; ``hf_hub`` downloads ``<owner>/<repo>[/<subdir>]`` for repos
on the ``KC_LORA_HF_REPOS`` allow-list. Each is inactive while its variable is unset.
"""

from kernelcore import envs, hookimpl

envs.declare("KC_LORA_HF_REPOS", envs.csv, owner="lora")  # Hugging Face repos the hf_hub resolver may serve


@hookimpl(trylast=True)
def register_lora_resolvers(registry) -> None:
    from builtin_plugins.lora.filesystem import FilesystemResolver
    from builtin_plugins.lora.hf_hub import HFHubResolver

    if envs.KC_LORA_RESOLVER_DIR:
        registry.register("filesystem", FilesystemResolver(envs.KC_LORA_RESOLVER_DIR), order=10)
    if envs.KC_LORA_HF_REPOS:
        registry.register("hf_hub", HFHubResolver(envs.KC_LORA_HF_REPOS), order=90)
