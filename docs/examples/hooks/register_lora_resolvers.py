import os

from kernelcore import hookimpl
from kernelcore.lora.resolver import child_of


class SharedDirResolver:
    def __init__(self, root):
        self.root = root

    def resolve_lora(self, base_model_name, lora_name):
        path = child_of(self.root, lora_name)  # refuses "..", "/", absolute names and symlink escapes
        return path if os.path.isfile(os.path.join(path, "adapter_config.json")) else None


@hookimpl
def register_lora_resolvers(registry):
    registry.register("nova_shared", SharedDirResolver("/srv/adapters"), order=20)
