"""The CPU plugin's layers (builtin_plugins/cpu/): a module imports only modules of its own layer or below, in
any form (module level, inside a function, under ``if TYPE_CHECKING:``), and no imports form a circle.

  1 build     building and loading native code, the CPU's facts, the launch machinery kernel wrappers use
  2 kernels   one native kernel each, and the process tuning that imports nothing of the plugin
  3 methods   the linear and MoE methods over those kernels
  4 platform  the platform hooks, worker, model runner, attention and graph-capture backends, kernel table
"""

import ast
import graphlib
from pathlib import Path

PACKAGE = "builtin_plugins.cpu"
ROOT = Path(__file__).parent.parent / "builtin_plugins" / "cpu"

LAYERS = {
    "cpuinfo": 1, "launch": 1, "native": 1,
    "pointwise": 2, "small_gemm": 2, "gguf_native": 2, "thread_policy": 2, "allocator": 2, "hugepages": 2,
    "linear": 3, "linear_tuning": 3, "moe": 3, "gguf_linear": 3,
    "platform": 4, "worker": 4, "model_runner": 4, "attention": 4, "graphs": 4, "kernels": 4, "components": 4,
    "__init__": 4,
}


def modules() -> dict[str, Path]:
    """Module name relative to the package ('graphs', 'sub.mod'; '__init__' for the package) -> file."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)] = path
    return found


def plugin_imports(source: str, package: str = PACKAGE, known: set[str] | None = None) -> set[str]:
    """The plugin modules a source imports anywhere in it; ``package``: the one its relative imports start from."""
    known = set(modules()) if known is None else known
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to the file's package: from . import x, from .x import y
                base = ".".join(filter(None, [package.rsplit(".", node.level - 1)[0], node.module]))
            names |= {f"{base}.{alias.name}" for alias in node.names}  # a submodule, or a name in `base`
    found = set()
    for name in names:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            continue
        rest = name[len(PACKAGE) + 1:]
        while rest and rest not in known:  # 'graphs.launch' is graphs; an unknown name of the package is __init__
            rest = rest.rpartition(".")[0]
        found.add(rest or "__init__")
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the other plugin modules it imports."""
    files = modules()
    return {module: plugin_imports(path.read_text(), ".".join([PACKAGE, *path.relative_to(ROOT).parent.parts]),
                                   set(files)) - {module}
            for module, path in files.items()}


def test_every_module_is_placed_in_a_layer():
    assert set(modules()) == set(LAYERS)


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} (layer {LAYERS[module]}) imports {target} (layer {LAYERS[target]})"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            if LAYERS[target] > LAYERS[module]]


def test_no_module_imports_a_higher_layer():
    assert not upward(import_graph())


def test_no_import_circles_within_a_layer():
    graphlib.TopologicalSorter(import_graph()).prepare()  # raises CycleError


def test_the_checker_sees_function_level_and_type_checking_imports():
    source = """
from typing import TYPE_CHECKING
import torch
if TYPE_CHECKING:
    from builtin_plugins.cpu.linear import fast_linear
def f():
    from . import worker
    from .graphs import CpuTape
    import builtin_plugins.cpu.moe
    from builtin_plugins.cpu import envs_declared_in_init
"""
    assert plugin_imports(source) == {"linear", "worker", "graphs", "moe", "__init__"}
    lazy = plugin_imports("def f():\n    from .graphs import launch\n")  # as native.py once had it
    assert upward({"native": lazy}) == ["native (layer 1) imports graphs (layer 4)"]
