from kernelcore import hookimpl


@hookimpl
def register_structured_output_backends(registry):
    # factory(tokenizer, vocab_size) -> a StructuredOutputBackend; tried before llguidance (order 10) under auto
    registry.register("nova_grammar", "nova_kc.grammar:NovaGrammarBackend", order=5)
