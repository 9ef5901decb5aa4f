"""Regenerate docs/hooks.md from kernelcore/contract/hookspecs.py and docs/examples/hooks/<hook>.py:
python scripts/gen_hooks_doc.py > docs/hooks.md"""

import inspect
import os
import re

from kernelcore.contract import hookspecs

HEADER = """# Hook reference

Every hook of `kernelcore/contract/hookspecs.py`, with its exact signature. Implement a hook with
`from kernelcore import hookimpl` and a function (or platform method) of the same name; pluggy lets an
implementation accept only some of the parameters. Each hook ends with an example from
`docs/examples/hooks/`, which `tests/test_docs.py` runs; the test also compares this whole page with the
generator's output: regenerate it with `python scripts/gen_hooks_doc.py > docs/hooks.md`. Platform hooks are
methods of the `Platform` subclass; the others are functions of a general plugin module.

Entry-point groups: `kernelcore.platform_plugins` (detectors), `kernelcore.general_plugins` (everything else),
`kernelcore.stat_logger_plugins` (a `StatLoggerBase` subclass, not a pluggy plugin).
"""


EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "examples", "hooks")


def example(name: str) -> str:
    with open(os.path.join(EXAMPLES, f"{name}.py")) as f:
        return f.read().rstrip("\n")


def render() -> str:
    out = [HEADER]
    for name, fn in vars(hookspecs).items():
        if not hasattr(fn, "kernelcore_spec"):
            continue
        signature = str(inspect.signature(fn)).replace("'", "")
        doc = inspect.getdoc(fn)
        for role in (":func:", ":class:", ":mod:"):
            doc = doc.replace(role, "")
        doc = re.sub(r"^:param (\w+):", r"- `\1`:", doc, flags=re.M).replace(":returns:", "- returns:")
        out.append(f"## `{name}{signature}`\n\n{doc}\n")
        if fn.kernelcore_spec.get("firstresult"):
            out.append("*First result*: the call stops at the first non-None answer.\n")
        out.append(f"Example (`docs/examples/hooks/{name}.py`):\n\n```python\n{example(name)}\n```\n")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
