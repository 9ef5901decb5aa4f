"""The package layering the core promises: the shared types sit below the engine and the executors,
the executors never import the engine, and the engine reaches an executor only through its registry.
Function-level imports count: they are import edges at run time too."""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    skip = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
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
            found[os.path.relpath(path, ROOT)] = {n for n in names if n.split(".")[0] in ("kernelcore", "builtin_plugins")}
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
