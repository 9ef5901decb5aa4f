"""Test-only plugin: a scripted model (its logits spell fixed completions), a third-party grammar backend
(``dummy_choice``: choice constraints only) and a third-party tool-call parser (``dummy_xml``)."""

from kernelcore import hookimpl


@hookimpl
def register_models(registry):
    registry.register_model("KcScriptedLlama", "kc_dummy_structured.scripted:KcScriptedLlama")


@hookimpl
def register_structured_output_backends(registry):
    registry.register("dummy_choice", "kc_dummy_structured.choice_backend:ChoiceBackend", order=90)


@hookimpl
def register_tool_parsers(registry):
    registry.register("dummy_xml", "kc_dummy_structured.xml_parser:XmlToolParser")
