"""The documentation cannot drift from the contract."""

import inspect
import os
import re

from kernelcore import hookspecs

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs")


def hookspec_functions():
    return {name: fn for name, fn in vars(hookspecs).items() if hasattr(fn, "kernelcore_spec")}


def test_every_hookspec_is_documented_with_its_exact_signature():
    text = open(os.path.join(DOCS, "hooks.md")).read()
    documented = dict(re.findall(r"^## `(\w+)(\(.*\).*)`$", text, flags=re.M))
    for name, fn in hookspec_functions().items():
        signature = str(inspect.signature(fn)).replace("'", "")
        assert documented.get(name) == signature, f"docs/hooks.md: '## `{name}{signature}`' missing or stale"
    assert set(documented) == set(hookspec_functions()), "docs/hooks.md documents hooks that do not exist"


def test_every_hookspec_docstring_says_where_it_is_called():
    for name, fn in hookspec_functions().items():
        doc = inspect.getdoc(fn) or ""
        assert "Called in:" in doc, f"{name}: docstring must say in which process it is called"
        if fn.kernelcore_spec.get("firstresult"):
            assert "first non-None result" in doc, f"{name}: firstresult hooks must say so"


def test_hooks_md_is_exactly_the_generated_page():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_hooks_doc",
                                                  os.path.join(DOCS, "..", "scripts", "gen_hooks_doc.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert open(os.path.join(DOCS, "hooks.md")).read() == gen.render(), \
        "docs/hooks.md is stale: python scripts/gen_hooks_doc.py > docs/hooks.md"
