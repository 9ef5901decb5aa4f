"""Regenerate docs/hooks.md from kernelcore/hookspecs.py: python scripts/gen_hooks_doc.py > docs/hooks.md"""

import inspect
import re

from kernelcore import hookspecs

HEADER = """# Hook reference

Every hook of `kernelcore/hookspecs.py`, with its exact signature. Implement a hook with
`from kernelcore import hookimpl` and a function (or platform method) of the same name; pluggy lets an
implementation accept only some of the parameters. This page is checked against the code by
`tests/test_docs.py`; regenerate it with `python scripts/gen_hooks_doc.py > docs/hooks.md`.

Entry-point groups: `kernelcore.platform_plugins` (detectors), `kernelcore.general_plugins` (everything else),
`kernelcore.stat_logger_plugins` (a `StatLoggerBase` subclass, not a pluggy plugin).
"""


def main() -> None:
    print(HEADER)
    for name, fn in vars(hookspecs).items():
        if not hasattr(fn, "kernelcore_spec"):
            continue
        signature = str(inspect.signature(fn)).replace("'", "")
        doc = inspect.getdoc(fn)
        for role in (":func:", ":class:", ":mod:"):
            doc = doc.replace(role, "")
        doc = re.sub(r"^:param (\w+):", r"- `\1`:", doc, flags=re.M).replace(":returns:", "- returns:")
        print(f"## `{name}{signature}`\n\n{doc}\n")
        if fn.kernelcore_spec.get("firstresult"):
            print("*First result*: the call stops at the first non-None answer.\n")


if __name__ == "__main__":
    main()
