"""The general hooks: what a ``kernelcore.general_plugins`` plugin contributes (ops, models, kernels, quantization,
HTTP endpoints, LoRA resolvers, executors, structured outputs, parsers, speculative proposers).

The whole contract, with the order pluggy calls implementations in, is :mod:`kernelcore.contract.hookspecs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelcore.contract.markers import hookspec

if TYPE_CHECKING:
    from kernelcore.contract.executors import ExecutorRegistry
    from kernelcore.contract.kernels import KernelTable
    from kernelcore.contract.lora import LoRAResolverRegistry
    from kernelcore.contract.models import ModelRegistry
    from kernelcore.contract.parsers import ReasoningParserRegistry, ToolParserRegistry
    from kernelcore.contract.quantization import QuantizationRegistry
    from kernelcore.contract.speculative import SpeculativeProposerRegistry
    from kernelcore.contract.structured_output import StructuredOutputBackendRegistry


# -- registration (general hooks) -------------------------------------------------


@hookspec
def register_ops() -> None:
    """Import the modules that replace in-tree custom ops.

    Typically imports a module whose classes use
    ``@InTreeOp.register_oot``. Must be re-entrant.

    Called in: every process, once, when the general plugins load.
    """


@hookspec
def register_models(registry: ModelRegistry) -> None:
    """Register model architectures.

    Call ``registry.register_model(arch, cls_or_"module:Class")``. The string
    form imports nothing until the architecture is asked for.

    :param registry: the process's model registry.

    Called in: every process, once, when the general plugins load.
    """


@hookspec
def register_kernels(kernels: KernelTable) -> None:
    """Contribute named kernel implementations to the kernel table.

    Call ``kernels.register(name, fn)``.

    :param kernels: the process's kernel table.

    Called in: every process, once, when the general plugins load.
    """


@hookspec
def register_triton_kernel_overrides(kernels: KernelTable) -> None:
    """Replace core kernels before any worker or model code can launch them.

    Call ``kernels.override(name, fn)``, e.g. a torch fallback where Triton
    cannot run; the override is recorded under the implementing plugin's name
    and the core writes the winners to the plugin trace (``kernel_table``).
    On an out-of-tree platform an in-tree op whose kernels (its
    ``kernel_names``) are all overridden runs them from its default
    ``forward_oot``.

    :param kernels: the process's kernel table.

    Called in: every worker, right after the general plugins load and before
    the worker class is resolved.
    """


@hookspec
def register_quantization_methods(registry: QuantizationRegistry) -> None:
    """Contribute linear methods selectable with ``--quantization NAME``.

    Call ``registry.register(name, cls_or_"module:Class")``; the class is a
    :class:`~kernelcore.layers.linear.LinearMethodBase` subclass, instantiated
    once per linear layer (``process_weights_after_loading(layer)`` after the
    checkpoint is loaded, ``apply(layer, x, bias)`` per forward). ``"none"``
    is the core's unquantized method. A platform replaces a method for its
    device with ``registry.register(name, cls, override=True)``: the platform
    runs last, so its override wins (the CPU platform does this for ``"none"``
    with oneDNN-prepacked weights and for ``"int8"`` with an int8 matmul).
    Registering a name another plugin owns without ``override`` raises.

    GGUF tensor types are methods too: a ``.gguf`` model loads only if every
    tensor's type ``T`` has a method named ``gguf_<t>`` (``gguf_q4_k``; built
    in: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL,
    IQ4_XS); another type is refused at start-up naming it and the tensor.
    Such a method is given a part of a layer (a
    :class:`~kernelcore.models.gguf_params.GGUFPart`: rows ``start:stop`` of
    one type, e.g. the v rows of a fused qkv) holding the file's blocks as
    ``part.qweight`` (uint8 [rows, row_bytes]) and ``part.gguf_type``;
    ``apply(part, x, None)`` returns those rows' outputs and, for a token
    embedding, ``embedding(part, ids)`` its rows. The CPU platform overrides
    the built-in pure-torch ones with native kernels.

    :param registry: the process's :class:`~kernelcore.contract.quantization.QuantizationRegistry`.

    Not first-result: every implementation is called, the platform's last.

    Called in: the front-end process when the config is built (an unknown
    ``--quantization`` is refused there), and every worker before the model is
    built; once per process.
    """


# -- HTTP server (general hooks) ---------------------------------------------------


@hookspec
def register_endpoints(app: Any, engine: Any) -> Any:
    """Add HTTP routes to the API server.

    Call ``app.router.add_get(path, handler)`` (or any aiohttp router method);
    prefer a namespaced path (``/plugins/<name>/...``). A route that clashes
    with a core route makes the plugin fail. The routes sit behind the same
    middlewares as the core ones (``--api-key``, body limits, error envelope).
    An API family with its own shapes builds on the shared request path:
    :func:`kernelcore.entrypoints.server.generate.start_chat` turns an OpenAI
    chat body into parsed choices or deltas with every check the core routes
    make, and :func:`kernelcore.entrypoints.server.errors.set_error_format`
    gives its paths its own error shape.

    Endpoint plugins shipped with kernelcore (its built-in API families) are on
    unless named in ``--disable-endpoint-plugins``. A third party's are off by
    default: only plugins named in ``--endpoint-plugins`` /
    ``KC_ENDPOINT_PLUGINS`` (independent of the ``KC_PLUGINS`` allow-list), or
    every plugin with ``kc serve --enable-endpoint-plugins``, are called. A
    plugin that raises is skipped and logged with its name; the server still
    starts.

    :param app: the :class:`aiohttp.web.Application`, before it starts.
    :param engine: the :class:`~kernelcore.engine.async_llm.AsyncLLM` serving requests.
    :returns: None, or an awaitable that is awaited before the server starts.

    Called in: the front-end process, once, when ``kc serve`` builds the app.
    """


# -- LoRA (general hooks) ----------------------------------------------------------


@hookspec
def register_lora_resolvers(registry: LoRAResolverRegistry) -> None:
    """Contribute resolvers that map an unknown model name to a local LoRA adapter directory.

    Call ``registry.register(name, resolver, order=50)``; ``resolver.resolve_lora(base_model_name,
    lora_name)`` (plain or ``async``) returns a directory holding ``adapter_config.json``, or None to pass.
    Resolvers are tried by ascending ``order``, ties by name; the built-in plugin ``lora`` registers
    ``filesystem`` (``KC_LORA_RESOLVER_DIR``, order 10) and ``hf_hub`` (``KC_LORA_HF_REPOS``, order 90).
    Registering a name twice raises. A plugin whose hook raises is logged and skipped; a resolver that
    raises fails that lookup with HTTP 400 naming the resolver and the adapter.

    :param registry: a fresh :class:`~kernelcore.contract.lora.LoRAResolverRegistry`.

    Called in: the front-end process, on every lookup of an unknown model name (``kc serve`` with
    ``--enable-lora --allow-runtime-lora-updating``); the registry is rebuilt each time, never snapshotted.
    """


# -- executors (general hooks) ------------------------------------------------------


@hookspec
def register_executor_backends(registry: ExecutorRegistry) -> None:
    """Contribute executor backends, selectable with ``--distributed-executor-backend NAME``.

    Call ``registry.register(name, cls_or_"pkg.mod:Class")``; a string is imported only when chosen. The
    class implements :class:`~kernelcore.executor.base.ExecutorBase`: it is constructed with the finished
    config in the engine-core process and starts and drives every worker of that engine. The core
    registers ``uni`` (one worker inside the engine core); the built-in plugin ``executors`` registers
    ``mp`` (one spawned process per rank, on one host or several). Without ``--distributed-executor-backend``
    one rank on one node runs ``uni`` and anything larger ``mp``. Registering a name twice raises; a plugin
    whose hook raises stops the engine's start-up with an error naming it.

    :param registry: a fresh :class:`~kernelcore.contract.executors.ExecutorRegistry`.

    Called in: the engine-core process (or any process that builds an ``EngineCore``), once per engine,
    when its executor is chosen; and the front end of ``kc serve``, to reject an unknown name before start-up.
    """


# -- structured outputs, tool calls, reasoning (general hooks) -----------------------------------------------


@hookspec
def register_structured_output_backends(registry: StructuredOutputBackendRegistry) -> None:
    """Contribute grammar backends for constrained decoding (JSON Schema, JSON object, regex, choice, grammar).

    Call ``registry.register(name, factory, order=50)``. ``factory(tokenizer, vocab_size)`` (a callable or a
    ``"module:Class"`` string, imported on first use) returns a
    :class:`~kernelcore.contract.structured_output.StructuredOutputBackend`. ``--structured-outputs-backend auto``
    tries backends by ascending ``order`` (ties by name) and moves on when one raises
    :class:`~kernelcore.contract.structured_output.UnsupportedConstraint`; the built-in plugin
    ``structured_outputs`` registers ``guidance`` (llguidance, order 10). Registering a name twice raises.

    :param registry: a fresh :class:`~kernelcore.contract.structured_output.StructuredOutputBackendRegistry`.

    Called in: the front-end process (to validate a constraint: a 400 before the engine sees it) and the
    engine-core process (to compile it and build the per-step token bitmask), once each, on the first
    constrained request; also by ``kc plugins``.
    """


@hookspec
def register_tool_parsers(registry: ToolParserRegistry) -> None:
    """Contribute tool-call parsers: model output text -> content and tool calls (``tool_choice="auto"``).

    Call ``registry.register(name, cls)``; ``cls(tokenizer)`` is a
    :class:`~kernelcore.contract.parsers.ToolParser` (a ``"module:Class"`` string is imported on first
    use). ``kc serve --enable-auto-tool-choice --tool-call-parser NAME`` chooses one. The built-in plugin
    ``structured_outputs`` registers ``hermes``, ``llama3_json``, ``mistral`` and ``pythonic``. Registering a
    name twice raises.

    :param registry: a fresh :class:`~kernelcore.contract.parsers.ToolParserRegistry`.

    Called in: the front-end process, once, when ``kc serve`` starts (and by ``kc plugins``).
    """


@hookspec
def register_reasoning_parsers(registry: ReasoningParserRegistry) -> None:
    """Contribute reasoning parsers: split a reasoning model's thinking from its answer.

    Call ``registry.register(name, cls)``; ``cls(tokenizer)`` is a
    :class:`~kernelcore.contract.parsers.ReasoningParser`. ``kc serve --reasoning-parser NAME``
    chooses one; the thinking goes to ``message.reasoning_content`` (``delta.reasoning_content`` when
    streaming). The built-in plugin ``structured_outputs`` registers ``deepseek_r1`` and ``qwen3``.
    Registering a name twice raises.

    :param registry: a fresh :class:`~kernelcore.contract.parsers.ReasoningParserRegistry`.

    Called in: the front-end process, once, when ``kc serve`` starts (and by ``kc plugins``).
    """


# -- speculative decoding (general hook) ---------------------------------------------------------------------


@hookspec
def register_speculative_proposers(registry: SpeculativeProposerRegistry) -> None:
    """Contribute speculative-decoding proposers: guessers of a request's next tokens.

    Call ``registry.register(name, factory)``. ``factory(config, vocab_size)`` (a callable or a
    ``"module:Class"`` string, imported on first use) returns a
    :class:`~kernelcore.contract.speculative.Proposer`; its settings are ``config.speculative`` (the
    ``--speculative-config`` JSON, keys kernelcore does not know in ``config.speculative.options``).
    ``kc serve --speculative-config '{"method": NAME, "num_speculative_tokens": K}'`` chooses one. The engine
    verifies the drafts in one forward pass and keeps only what plain decoding would give (greedy) or what
    rejection sampling accepts, so a proposer cannot change outputs, only speed. The built-in plugin
    ``speculative`` registers ``ngram`` (prompt lookup). Registering a name twice raises.

    :param registry: a fresh :class:`~kernelcore.contract.speculative.SpeculativeProposerRegistry`.

    Called in: the front-end process (to reject an unknown method before start-up) and the engine-core
    process (to build the proposer), once each; also by ``kc plugins``.
    """


# -- diagnostics (general or platform hook) ----------------------------------------------------------------------


@hookspec
def report_components() -> dict[str, str] | None:
    """Say which of the plugin's optional components work in this process and which fell back.

    A component is anything the plugin can run without, slower or with less: a compiled kernel library, a
    vendor runtime, an accelerated code path. Each value starts with ``"ok"`` (in use) or ``"missing"``
    (not in use; the rest of the string says why and what runs instead), so an operator sees a fallback
    instead of only a slower server. The answers are shown by ``kc plugins``, logged once at start-up
    (a warning for every ``"missing"``) and published on ``/metrics`` as
    ``kc:component_available{component=...}`` (1 or 0). The implementation may build or load what it
    reports on (it is asked once per process).

    :returns: component name -> status (names are shared across plugins: prefix them with the plugin's),
        or None when the plugin has nothing to report.

    Called in: the front-end process of ``kc serve`` and ``kc run-batch`` (start-up) and ``kc plugins``;
    every answer is kept (not first-result).
    """
