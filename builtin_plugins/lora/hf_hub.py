"""Download ``<owner>/<repo>[/<subdir>]`` from the Hugging Face Hub, only for allow-listed repos; fails fast."""

from __future__ import annotations

import asyncio
import fnmatch
import os

from kernelcore.lora.resolver import LoRAPathError, check_plain_name, confine


class HFHubResolver:
    def __init__(self, allowed_repos: list[str], timeout: float = 10.0) -> None:
        self.allowed_repos, self.timeout = list(allowed_repos), timeout

    def split(self, lora_name: str) -> tuple[str, str] | None:
        """(repo id, subdir) when the name is on the allow-list (fnmatch patterns), else None."""
        parts = lora_name.strip("/").split("/")
        if len(parts) < 2:
            return None
        for part in parts:
            check_plain_name(part)
        repo_id, subdir = "/".join(parts[:2]), "/".join(parts[2:])
        if not any(fnmatch.fnmatchcase(repo_id, pattern) for pattern in self.allowed_repos):
            return None
        return repo_id, subdir

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> str | None:
        target = self.split(lora_name)
        if target is None:
            return None
        repo_id, subdir = target
        try:
            root = await asyncio.wait_for(asyncio.to_thread(self._download, repo_id, subdir), self.timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"downloading {repo_id!r} from the Hugging Face Hub took over "
                               f"{self.timeout:.0f}s") from None
        path = confine(root, subdir or ".")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise LoRAPathError(f"{lora_name!r} on the Hub has no adapter_config.json")
        return path

    @staticmethod
    def _download(repo_id: str, subdir: str) -> str:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        patterns = [f"{subdir}/*"] if subdir else None
        try:
            return snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=5)
        except LocalEntryNotFoundError as exc:
            raise ConnectionError(f"the Hugging Face Hub is unreachable (offline?) and {repo_id!r} is not cached: "
                                  f"{exc}") from None
