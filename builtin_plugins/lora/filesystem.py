"""Serve ``<root>/<name>``: the name is one plain path component and the resolved directory stays in root."""

from __future__ import annotations

import os

from kernelcore.lora.adapter import CONFIG_NAME
from kernelcore.lora.resolver import child_of


class FilesystemResolver:
    def __init__(self, root: str) -> None:
        self.root = root

    def resolve_lora(self, base_model_name: str, lora_name: str) -> str | None:
        if not os.path.isdir(self.root):
            raise NotADirectoryError(f"KC_LORA_RESOLVER_DIR={self.root!r} is not a directory")
        path = child_of(self.root, lora_name)  # raises LoRAPathError for '..', '/', absolute, NUL, symlink escapes
        return path if os.path.isfile(os.path.join(path, CONFIG_NAME)) else None
