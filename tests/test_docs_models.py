"""docs/models.md's worked example is real: its code blocks are extracted from the page and run against
transformers, and they (like the hook examples) import only names docs/api.md lists."""

import json
import os
import re

import pytest
from helpers import run_python
from test_public_api import _imports, listed_names

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs")


def code_block(name: str) -> str:
    text = open(os.path.join(DOCS, "models.md")).read()
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)\n```", text, flags=re.S)
    assert match, f"docs/models.md has no '<!-- example: {name} -->' code block"
    return match.group(1) + "\n"


@pytest.mark.slow
def test_worked_example_matches_transformers(tmp_path):
    (tmp_path / "docs_qwen2.py").write_text(code_block("docs_qwen2"))
    (tmp_path / "parity.py").write_text(code_block("parity"))
    out = run_python(f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from docs_qwen2 import DocsQwen2ForCausalLM
        from parity import check_parity
        from kernelcore.models import model_registry
        diff = check_parity({str(tmp_path / "ckpt")!r}, "DocsQwen2ForCausalLM", DocsQwen2ForCausalLM)
        info = model_registry.inspect("DocsQwen2ForCausalLM")
        print(json.dumps([diff, info.supports_tensor_parallel, info.supports_lora]))
    """).stdout
    diff, is_tp, is_lora = json.loads(out.strip().splitlines()[-1])
    assert diff < 1e-4 and is_tp and is_lora


def test_doc_examples_import_only_public_names(tmp_path):
    public = set(listed_names())
    modules = {n for n in public if n.count(".") == 1} | {"kernelcore"}
    sources = {"models.md:docs_qwen2": code_block("docs_qwen2"), "models.md:parity": code_block("parity")}
    hooks_dir = os.path.join(DOCS, "examples", "hooks")
    sources.update({f: open(os.path.join(hooks_dir, f)).read() for f in os.listdir(hooks_dir) if f.endswith(".py")})
    offenders = []
    for label, source in sources.items():
        path = tmp_path / "snippet.py"
        path.write_text(source)
        offenders += [f"{label}: {name}" for name in _imports(str(path)) if name not in public | modules]
    assert not offenders, "not in docs/api.md: " + ", ".join(offenders)
