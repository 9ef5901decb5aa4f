"""docs/api.md is the public API: every listed name imports, the dummy plugin packages use nothing else,
and the contract version and deprecation helpers behave as documented."""

import ast
import importlib
import os
import re
import warnings

import pluggy
import pytest

import kernelcore
from kernelcore import contract

ROOT = os.path.join(os.path.dirname(__file__), "..")
NAME = re.compile(r"^\| `((?:kernelcore|builtin_plugins)(?:\.\w+)*)` \|", re.M)


def _api_md() -> tuple[str, str]:
    """docs/api.md split into (the public tables, the "Deprecated names" table)."""
    text = open(os.path.join(ROOT, "docs", "api.md")).read()
    start = text.index("### Deprecated names")
    end = text.index("\n## ", start)
    return text[:start] + text[end:], text[start:end]


def listed_names() -> list[str]:
    return NAME.findall(_api_md()[0])


def deprecated_names() -> list[str]:
    return NAME.findall(_api_md()[1])


def resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_api_md_lists_a_substantial_surface():
    names = listed_names()
    assert len(names) > 60 and len(names) == len(set(names)), "duplicate rows in docs/api.md"


@pytest.mark.parametrize("dotted", listed_names())
def test_every_listed_name_imports(dotted):
    assert resolve(dotted) is not None


@pytest.mark.parametrize("dotted", deprecated_names())
def test_every_deprecated_name_still_imports_with_a_warning(dotted):
    module, name = dotted.rsplit(".", 1)
    with pytest.warns(contract.KernelcoreDeprecationWarning, match="is deprecated"):
        assert getattr(importlib.import_module(module), name) is not None


def test_moved_types_are_the_same_objects_under_their_new_names():
    from kernelcore.core_types import sampling_params
    from kernelcore.errors import WorkerDiedError
    from kernelcore.executor.base import WorkerDiedError as FromBase

    with pytest.warns(contract.KernelcoreDeprecationWarning, match="use kernelcore.core_types.sampling_params"):
        from kernelcore.engine.sampling_params import SamplingParams as Old
    assert Old is sampling_params.SamplingParams is kernelcore.SamplingParams
    assert WorkerDiedError is FromBase


def _imports(path: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("kernelcore",
                                                                                               "builtin_plugins"):
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.split(".")[0] in ("kernelcore", "builtin_plugins")}
    return names


def test_dummy_plugin_packages_import_only_public_names():
    public = set(listed_names())
    public_modules = {n for n in public if n.count(".") == 1} | {"kernelcore"}
    plugins_dir = os.path.join(ROOT, "tests", "plugins")
    offenders = []
    for folder, dirs, files in os.walk(plugins_dir):
        dirs[:] = [d for d in dirs if d != "build" and not d.endswith(".egg-info")]
        for f in files:
            if f.endswith(".py"):
                for name in _imports(os.path.join(folder, f)):
                    if name not in public and name not in public_modules:
                        offenders.append(f"{os.path.relpath(os.path.join(folder, f), plugins_dir)}: {name}")
    assert not offenders, "not in docs/api.md: " + ", ".join(sorted(offenders))


def test_layers_are_importable_from_the_package():
    from kernelcore.layers import QKVParallelLinear, RMSNorm, RotaryEmbedding
    from kernelcore.layers.norm import RMSNorm as InModule

    assert RMSNorm is InModule and RotaryEmbedding.kernel_names and QKVParallelLinear


def test_require_contract():
    major, minor = kernelcore.CONTRACT_VERSION
    kernelcore.require_contract(f"{major}.{minor}")
    kernelcore.require_contract(f"{major}.0")
    with pytest.raises(contract.ContractVersionError, match="nova needs kernelcore plugin contract"):
        kernelcore.require_contract(f"{major}.{minor + 1}", plugin="nova")
    with pytest.raises(contract.ContractVersionError):
        kernelcore.require_contract(f"{major + 1}.0")
    with pytest.raises(ValueError):
        kernelcore.require_contract("one")


def test_deprecated_hook_warns_when_a_plugin_implements_it():
    spec, impl = pluggy.HookspecMarker("kernelcore"), pluggy.HookimplMarker("kernelcore")

    class Specs:
        @spec(warn_on_impl=contract.deprecated_hook_warning("old_hook", "new_hook", removed_in="1.2"))
        def old_hook(self):
            """Deprecated."""

    class Plugin:
        @impl
        def old_hook(self):
            return 1

    pm = pluggy.PluginManager("kernelcore")
    pm.add_hookspecs(Specs)
    with pytest.warns(contract.KernelcoreDeprecationWarning, match="implement 'new_hook' instead"):
        pm.register(Plugin())
    assert pm.hook.old_hook() == [1]  # still called for the deprecation period


def test_deprecated_name_still_served_with_a_warning():
    getattr_ = contract.deprecated_names("nova.api", {"OldName": ("nova.api.NewName", lambda: 42)}, removed_in="1.1")
    with pytest.warns(contract.KernelcoreDeprecationWarning, match="use nova.api.NewName"):
        assert getattr_("OldName") == 42
    with pytest.raises(AttributeError), warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr_("Missing")


def test_builtin_platforms_are_ordered_by_priority_not_by_name():
    from kernelcore import platforms

    cpu = platforms.Detection("cpu", "kernelcore", True, "builtin_plugins.cpu.platform.CpuPlatform")
    cuda = platforms.Detection("cuda", "kernelcore", True, "builtin_plugins.cuda.platform.CudaPlatform")
    other = platforms.Detection("aaa", "kernelcore", True, "kernelcore.platforms.Platform")  # priority 0
    assert platforms.choose([cpu, cuda])[0] is cuda
    assert platforms.choose([cpu, other])[0] is other
    assert platforms.choose([other, cuda])[0] is other  # equal priority: by name


def test_a_plugin_declares_its_own_environment_variable(monkeypatch):
    import builtin_plugins.cpu  # noqa: F401  (declares KC_CPU_NATIVE_KERNELS)
    from kernelcore import envs

    monkeypatch.setattr(envs, "VARIABLES", dict(envs.VARIABLES))  # restored afterwards
    monkeypatch.setattr(envs, "OWNERS", dict(envs.OWNERS))
    monkeypatch.setenv("KC_NOVA_CORES", "12")
    envs.declare("KC_NOVA_CORES", lambda v: int(v or 8), owner="nova")
    envs.declare("KC_NOVA_CORES", lambda v: int(v or 8), owner="nova")  # a re-import: fine
    assert envs.KC_NOVA_CORES == 12
    envs.freeze()
    monkeypatch.setenv("KC_NOVA_CORES", "3")
    assert envs.KC_NOVA_CORES == 12
    with pytest.raises(ValueError, match="nova already declared"):
        envs.declare("KC_NOVA_CORES", int, owner="other")
    with pytest.raises(ValueError, match="start with KC_"):
        envs.declare("NOVA_CORES", int, owner="nova")
    assert envs.OWNERS["KC_CPU_NATIVE_KERNELS"] == "cpu"  # the built-in plugins declare theirs the same way


def test_names_deprecated_until_1_1_are_gone():
    from kernelcore import config, kernels

    assert not hasattr(kernels, "trace_winners") and not hasattr(config.CacheConfig(), "is_block_size_user_set")
