"""The package layering the core promises: the shared types sit below the engine and the executors,
the executors never import the engine, and the engine reaches an executor only through its registry.
Function-level imports count: they are import edges at run time too."""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    skip = {id(n) for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if id(n) not in skip]


def imported_modules(package_dir: str) -> dict[str, set[str]]:
    """file -> every kernelcore/builtin_plugins module it imports at run time, anywhere in the file."""
    found = {}
    for folder, _dirs, files in os.walk(os.path.join(ROOT, package_dir)):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            names = set()
            for node in _runtime_nodes(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module)
                    names |= {f"{node.module}.{a.name}" for a in node.names}
                elif isinstance(node, ast.Import):
                    names |= {a.name for a in node.names}
            found[os.path.relpath(path, ROOT)] = {n for n in names
                                                  if n.split(".")[0] in ("kernelcore", "builtin_plugins")}
    return found


def offenders(package_dir: str, forbidden: str, allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(f"{path}: {name}" for path, names in imported_modules(package_dir).items() for name in names
                  if (name == forbidden or name.startswith(forbidden + ".")) and not name.startswith(allowed))


@pytest.mark.parametrize("package_dir", ["kernelcore/executor", "kernelcore/core_types", "builtin_plugins/executors"])
def test_executors_and_shared_types_never_import_the_engine(package_dir):
    assert not offenders(package_dir, "kernelcore.engine")


def test_shared_types_import_neither_engine_nor_executor():
    assert not offenders("kernelcore/core_types", "kernelcore.executor")


def test_the_engine_reaches_executors_only_through_the_registry():
    assert not offenders("kernelcore/engine", "kernelcore.executor", allowed=("kernelcore.executor.registry",))


def test_the_checker_sees_function_level_imports():
    found = imported_modules("kernelcore/engine")
    assert "kernelcore.engine.dp_router" in found[os.path.join("kernelcore", "engine", "async_llm.py")]


def module_graph() -> dict[str, set[str]]:
    """kernelcore module -> the kernelcore modules it imports at run time (a package counts as its __init__)."""
    files = imported_modules("kernelcore")
    modules = {path[:-3].replace(os.sep, ".").removesuffix(".__init__"): path for path in files}
    graph = {}
    for module, path in modules.items():
        edges = set()
        for name in files[path]:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # a package's own parents
                edges.add(name)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


KNOWN_EDGES: set[tuple[str, str]] = set()  # edges that close a circle on purpose: none


def test_plugin_loading_never_imports_platform_resolution():
    assert "kernelcore.platforms" not in module_graph()["kernelcore.plugins"]


def test_no_runtime_import_circles_in_the_core():
    graph = {m: {t for t in edges if (m, t) not in KNOWN_EDGES} for m, edges in module_graph().items()}
    assert not cycles(graph)


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


# -- the strict count: every import is a dependency a reader must follow --------------------------------------
#
# Module-level, function-level and ``if TYPE_CHECKING:`` imports alike, relative ones resolved, and the benchmarks'
# sys.path imports (``import gpu_perf``) counted as the modules they are.

STRICT_ROOTS = ("kernelcore", "builtin_plugins", "benchmarks")


def strict_graph(source_for=None) -> dict[str, set[str]]:
    """module -> the modules of STRICT_ROOTS it imports, in any form (a package counts as its __init__)."""
    paths = {}
    for root in STRICT_ROOTS:
        for folder, _dirs, files in os.walk(os.path.join(ROOT, root)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), ROOT)
                    paths[rel[:-3].replace(os.sep, ".").removesuffix(".__init__")] = rel
    sources = source_for or (lambda rel: open(os.path.join(ROOT, rel)).read())
    graph = {}
    for module, rel in paths.items():
        package = module.split(".") if rel.endswith("__init__.py") else module.split(".")[:-1]
        edges = set()
        for node in ast.walk(ast.parse(sources(rel))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if module.startswith("benchmarks.") and f"benchmarks.{name}" in paths:
                    name = f"benchmarks.{name}"
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != module and not module.startswith(name + "."):
                    edges.add(name)
        graph[module] = edges
    return graph


# kernelcore's floors, bottom up: a module belongs to the floor of its longest matching prefix, and may import
# its own floor and those below. docs/architecture.md draws the same picture.
FLOORS = [
    ("contract", ["kernelcore.contract"]),
    ("foundation", ["kernelcore.envs", "kernelcore.errors", "kernelcore.hostproc.role", "kernelcore.logging_setup",
                    "kernelcore.kernels", "kernelcore.models.registry", "kernelcore.core_types", "kernelcore.config",
                    "kernelcore.hookspecs", "kernelcore.structured_output.params"]),
    ("plugin machinery", ["kernelcore.plugins", "kernelcore.platforms", "kernelcore.quantization",
                          "kernelcore.executor.registry", "kernelcore.lora.resolver",
                          "kernelcore.structured_output.backend", "kernelcore.entrypoints.tool_parsers",
                          "kernelcore.entrypoints.reasoning_parsers", "kernelcore.speculative.proposer"]),
    ("model", ["kernelcore.custom_op", "kernelcore.distributed", "kernelcore.forward_context", "kernelcore.attention",
               "kernelcore.layers", "kernelcore.models", "kernelcore.config_builder", "kernelcore.config_fingerprint",
               "kernelcore.pipeline", "kernelcore.model_fetch"]),
    ("processes", ["kernelcore.hostproc"]),
    ("executor", ["kernelcore.executor", "kernelcore.lora"]),
    ("engine", ["kernelcore.engine", "kernelcore.structured_output", "kernelcore.speculative", "kernelcore.metrics"]),
    ("entrypoints", ["kernelcore.entrypoints", "kernelcore.conformance", "kernelcore"]),
]
MAX_UPWARD = 10
KNOWN_UPWARD: set[tuple[str, str]] = set()  # imports that run back up on purpose: none


def floor_of(module: str) -> int:
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is on no floor: add it to FLOORS"
    return max(matches)[1]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, t) for m, targets in graph.items() if m.startswith("kernelcore") for t in targets
            if t.startswith("kernelcore") and floor_of(t) > floor_of(m)}


def test_no_import_circle_anywhere_by_the_strict_count():
    assert cycles(strict_graph()) == []


def test_the_contract_imports_nothing_of_kernelcore_above_it():
    graph = strict_graph()
    outside = {(m, t) for m, targets in graph.items() if m.startswith("kernelcore.contract") for t in targets
               if not t.startswith("kernelcore.contract")}
    assert not outside


def test_imports_run_down_the_floors():
    graph = strict_graph()
    for module in graph:
        if module.startswith("kernelcore"):
            floor_of(module)
    upward = upward_imports(graph)
    assert upward <= KNOWN_UPWARD, sorted(upward - KNOWN_UPWARD)
    assert len(KNOWN_UPWARD) <= MAX_UPWARD


def test_kernelcore_never_imports_a_builtin_plugin_or_a_benchmark():
    assert not {(m, t) for m, targets in strict_graph().items() if m.startswith("kernelcore") for t in targets
                if not t.startswith("kernelcore")}


def test_the_strict_checker_sees_every_form_of_import():
    files = {
        os.path.join("kernelcore", "contract", "__init__.py"): "",
        os.path.join("kernelcore", "contract", "a.py"): ("from typing import TYPE_CHECKING\n"
                                                         "if TYPE_CHECKING:\n    from kernelcore.engine import x\n"),
        os.path.join("kernelcore", "contract", "b.py"): "def f():\n    from . import a\n",
        os.path.join("kernelcore", "engine", "__init__.py"): "import kernelcore.contract.b\n",
    }
    real_walk = os.walk

    def fake_walk(top):
        rel = os.path.relpath(top, ROOT)
        by_dir: dict[str, list[str]] = {}
        for path in files:
            if path.startswith(rel + os.sep):
                by_dir.setdefault(os.path.join(ROOT, os.path.dirname(path)), []).append(os.path.basename(path))
        return [(folder, [], names) for folder, names in by_dir.items()]

    os.walk = fake_walk
    try:
        graph = strict_graph(lambda rel: files[rel])
    finally:
        os.walk = real_walk
    assert graph["kernelcore.contract.a"] == {"kernelcore.engine"}
    assert graph["kernelcore.contract.b"] == {"kernelcore.contract.a"}
    assert cycles(graph) == [{"kernelcore.contract.a", "kernelcore.contract.b", "kernelcore.engine"}]
