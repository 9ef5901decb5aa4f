"""Test helpers: run code in a fresh interpreter (platform and plugin state are per process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

DUMMY_ENV_VARS = ("KC_DUMMY_DEVICE", "KC_DUMMY_SECOND_DEVICE", "KC_DUMMY_BROKEN_DETECTOR", "KC_DUMMY_LEAVE_AUTO",
                  "KC_DUMMY_OPS", "KC_DUMMY_MODEL_RAISE", "KC_DUMMY_OVERRIDE_OPT", "KC_PLUGINS", "KC_BLOCK_PLUGINS",
                  "KC_PLATFORM", "KC_TRACE_PLUGINS", "KC_DUMMY_BLOCK_SIZE", "KC_DUMMY_DTYPE",
                  "KC_DUMMY_DRIVER", "KC_DUMMY_TYPO_HOOK", "KC_ENDPOINT_PLUGINS")


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DUMMY_ENV_VARS}
    env.update(overrides)
    return env


def run_python(code: str, *, check: bool = True, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=clean_env(**env), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snippet failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def run_kc(*args: str, check: bool = True, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", *args], env=clean_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kc {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def scripted_default_model(target: str, kc_script: dict[str, list[int]]) -> str:
    """The embedded default model's files in ``target`` (symlinked) as architecture KcScriptedLlama (the dummy
    model package), which writes ``kc_script[str(position)]``'s token ids from that position on."""
    import json

    from kernelcore.models.default_model import ensure_default_model

    source = ensure_default_model()
    for name in os.listdir(source):
        if name != "config.json":
            os.symlink(os.path.join(source, name), os.path.join(target, name))
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config.update(architectures=["KcScriptedLlama"], kc_script=kc_script)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(config, f)
    return target
