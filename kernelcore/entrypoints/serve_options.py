"""The options of `kc serve` (`kc run-batch` shares most of them): their declarations and their value parsers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20, "g": 1e9, "gb": 1e9,
          "gib": 1 << 30, "t": 1e12, "tb": 1e12, "tib": 1 << 40}


def parse_size(value: str | int | None) -> int | None:
    """``"2GiB"``, ``"512MB"``, ``"1048576"`` -> bytes."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE.match(value)
    if not match or match.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"{value!r} is not a size (e.g. 2GiB, 512MB, 1048576)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object")
    return parsed


def _lora_modules(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    modules = {}
    for value in (v for group in values for v in group.split()):
        if value.startswith("{"):
            parsed = _json_object(ctx, param, value) or {}
            name, path = parsed.get("name"), parsed.get("path")
        else:
            name, _, path = value.partition("=")
        if not name or not path:
            raise click.BadParameter(f"{value!r} must be name=path or {{\"name\": ..., \"path\": ...}}")
        modules[name] = path
    return modules


def _opt(*names: str, env: str, **kwargs: Any):
    return click.option(*names, envvar=env, show_envvar=True, show_default=kwargs.pop("show_default", True), **kwargs)


def parse_speculative_option(value: str | None):
    """--speculative-config as a checked SpeculativeConfig (a usage error names the problem)."""
    from kernelcore.speculative.proposer import parse_speculative_config

    try:
        return parse_speculative_config(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--speculative-config") from None


# In the order `kc serve --help` lists them.
_OPTIONS = (
    click.argument("model", required=False, envvar="KC_MODEL"),
    _opt("--host", env="KC_HOST", default="127.0.0.1", help="Interface to bind. Binding beyond loopback is explicit."),
    _opt("--port", env="KC_PORT", default=8000, type=int, help="TCP port (0 picks a free one)."),
    _opt("--tensor-parallel-size", "-tp", env="KC_TENSOR_PARALLEL_SIZE", type=int, default=None, show_default=False,
         help="Number of tensor-parallel workers [default: 1]."),
    _opt("--pipeline-parallel-size", "-pp", env="KC_PIPELINE_PARALLEL_SIZE", type=click.IntRange(min=1), default=None,
         show_default=False, help="Pipeline stages (layers split across them), each of -tp workers [default: 1]."),
    _opt("--data-parallel-size", "-dp", env="KC_DATA_PARALLEL_SIZE", type=click.IntRange(min=1), default=None,
         show_default=False, help="Engine replicas behind this API (each with its own -tp x -pp workers), requests "
         "balanced by load with prefix affinity [default: 1]."),
    _opt("--data-parallel-size-local", "-dpl", env="KC_DATA_PARALLEL_SIZE_LOCAL", type=click.IntRange(min=1),
         default=None, show_default=False, help="Replicas on this host; the others run on hosts started with "
         "--headless [default: all of --data-parallel-size]."),
    _opt("--data-parallel-start-rank", "-dpr", env="KC_DATA_PARALLEL_START_RANK", type=click.IntRange(min=0), default=0,
         help="With --headless: the first data-parallel rank this host runs (the head runs 0..local-1)."),
    _opt("--data-parallel-address", "-dpa", env="KC_DATA_PARALLEL_ADDRESS", default=None, show_default=False,
         help="With replicas on other hosts: the head's address; the head binds its data-parallel port to it (only "
         "to it) and the headless hosts' replicas connect there (authenticated with --cluster-secret)."),
    _opt("--data-parallel-rpc-port", "-dpp", env="KC_DATA_PARALLEL_RPC_PORT", type=click.IntRange(1, 65535),
         default=29560, help="With replicas on other hosts: the head's data-parallel port (engine-core control)."),
    _opt("--distributed-executor-backend", env="KC_DISTRIBUTED_EXECUTOR_BACKEND", default=None, show_default=False,
         help="Executor backend a plugin registered (built-in: uni, mp) [default: uni for one rank, else mp]."),
    _opt("--nnodes", env="KC_NNODES", type=click.IntRange(min=1), default=1, help="Hosts this engine spans."),
    _opt("--node-rank", env="KC_NODE_RANK", type=click.IntRange(min=0), default=0,
         help="This host's index: 0 runs the engine and the API, the others run --headless."),
    _opt("--master-addr", env="KC_MASTER_ADDR", default=None, show_default=False,
         help="With --nnodes > 1: the head's address; the head binds its cluster port to it (only to it)."),
    _opt("--master-port", env="KC_MASTER_PORT", type=click.IntRange(1, 65535), default=29550,
         help="With --nnodes > 1: the head's cluster port (control, rendezvous)."),
    _opt("--cluster-secret", env="KC_CLUSTER_SECRET", default=None, show_default=False,
         help="With --nnodes > 1: shared secret every host proves (HMAC challenge-response); required."),
    _opt("--headless", env="KC_HEADLESS", is_flag=True, default=False,
         help="Run this node's workers only (no API, no engine); needs --nnodes > 1 and --node-rank > 0."),
    _opt("--max-model-len", env="KC_MAX_MODEL_LEN", type=click.IntRange(min=1), default=None,
         help="Context length [default: the model's]."),
    _opt("--block-size", env="KC_BLOCK_SIZE", type=click.IntRange(min=1), default=None,
         help="KV-cache block size in tokens."),
    _opt("--max-num-seqs", env="KC_MAX_NUM_SEQS", type=click.IntRange(min=1), default=None,
         help="Most sequences per engine step."),
    _opt("--max-num-batched-tokens", env="KC_MAX_NUM_BATCHED_TOKENS", type=click.IntRange(min=1), default=None,
         help="Token budget per engine step."),
    _opt("--kv-cache-memory", env="KC_KV_CACHE_MEMORY", default=None,
         help="KV-cache size per rank, e.g. 2GiB (on the CPU it takes memory as tokens fill it)."),
    _opt("--kv-cache-dtype", env="KC_KV_CACHE_DTYPE", default=None,
         type=click.Choice(["auto", "float32", "bfloat16"]),
         help="KV-cache element type [default: auto, the model's dtype]; bfloat16 under a float32 model halves "
              "the cache (the CPU platform)."),
    _opt("--dtype", env="KC_DTYPE", default=None, type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
         help="Weight and activation dtype [default: the platform's; float32 on CPU, where 'auto' picks bfloat16 "
              "if the CPU has native bf16]."),
    _opt("--quantization", "-q", env="KC_QUANTIZATION", default=None, show_default=False,
         help="Quantize the weights at load: a method a plugin registered (built in: int8, weight-only per-channel; "
              "gguf, each layer as a .gguf file stores it, the default for one; none: a .gguf file dequantized)."),
    _opt("--tokenizer", env="KC_TOKENIZER", default=None, show_default=False,
         help="Tokenizer directory (Hugging Face files) [default: the model's own; a .gguf file's embedded "
              "vocabulary]."),
    _opt("--num-threads", env="KC_NUM_THREADS", type=int, default=None, show_default=False,
         help="Compute threads per worker [default: the CPU cores divided among the ranks]."),
    _opt("--skip-tokenizer-init", env="KC_SKIP_TOKENIZER_INIT", is_flag=True, default=False,
         help="Load no tokenizer: serve token-id prompts only, outputs without text (a checkpoint without "
              "tokenizer files is otherwise refused at start-up)."),
    _opt("--hf-overrides", env="KC_HF_OVERRIDES", default=None, callback=_json_object,
         help='JSON object applied over the HF config, e.g. \'{"rope_theta": 20000}\'.'),
    _opt("--chat-template", env="KC_CHAT_TEMPLATE", default=None,
         help="Chat template: a file path or an inline Jinja string [default: the tokenizer's]."),
    _opt("--trust-request-chat-template", env="KC_TRUST_REQUEST_CHAT_TEMPLATE", is_flag=True, default=False,
         help="Let requests bring their own chat_template."),
    _opt("--allow-special-tokens-in-content", env="KC_ALLOW_SPECIAL_TOKENS_IN_CONTENT", is_flag=True, default=False,
         help="Tokenize special-token text inside chat messages as special tokens (by default it is plain text, "
              "so a message cannot forge role markers or end-of-sequence)."),
    _opt("--max-choices", env="KC_MAX_CHOICES", type=int, default=64,
         help="Most sequences one request may ask for (prompts x n)."),
    _opt("--response-role", env="KC_RESPONSE_ROLE", default="assistant", help="Role of generated chat messages."),
    _opt("--served-model-name", env="KC_SERVED_MODEL_NAME", default=None,
         help="Name clients use for the model [default: the model directory's name]."),
    _opt("--api-key", env="KC_API_KEY", default=None, show_default=False,
         help="Require 'Authorization: Bearer KEY' on every route except /health, /ping and /metrics."),
    _opt("--enable-prefix-caching/--no-enable-prefix-caching", env="KC_ENABLE_PREFIX_CACHING", default=None,
         show_default=False, help="Reuse KV blocks of shared prompt prefixes [default: on]."),
    _opt("--seed", env="KC_SEED", type=int, default=None, help="Engine random seed."),
    _opt("--enforce-eager", env="KC_ENFORCE_EAGER", is_flag=True, default=False,
         help="Run every step eagerly: capture no decode graphs (CUDA graphs on the CUDA platform)."),
    _opt("--enable-endpoint-plugins", env="KC_ENABLE_ENDPOINT_PLUGINS", is_flag=True, default=False,
         help="Let every installed plugin add HTTP routes."),
    _opt("--endpoint-plugins", env="KC_ENDPOINT_PLUGINS", default=None, show_default=False,
         help="Comma-separated plugin names allowed to add HTTP routes (independent of KC_PLUGINS)."),
    _opt("--disable-endpoint-plugins", env="KC_DISABLE_ENDPOINT_PLUGINS", default=None, show_default=False,
         help="Comma-separated endpoint plugins to switch off, built-in ones included "
              "(`kc plugins` lists them)."),
    _opt("--enable-lora", env="KC_ENABLE_LORA", is_flag=True, default=False, help="Serve LoRA adapters."),
    _opt("--max-loras", env="KC_MAX_LORAS", type=int, default=None,
         help="Most adapters in one engine step [default: 4]."),
    _opt("--max-lora-rank", env="KC_MAX_LORA_RANK", type=int, default=None, help="Largest adapter rank [default: 16]."),
    _opt("--max-cpu-loras", env="KC_MAX_CPU_LORAS", type=int, default=None,
         help="Adapters kept loaded in memory per worker (LRU) [default: 8]."),
    _opt("--lora-modules", env="KC_LORA_MODULES", multiple=True, callback=_lora_modules, show_default=False,
         help="Adapters loaded at start-up: name=path (repeat the option, or separate with spaces)."),
    _opt("--allow-runtime-lora-updating", env="KC_ALLOW_RUNTIME_LORA_UPDATING", is_flag=True, default=False,
         help="Enable /v1/load_lora_adapter, /v1/unload_lora_adapter and resolver lookups of unknown model names."),
    _opt("--lora-root", env="KC_LORA_ROOT", default=None,
         help="Runtime lora_path must lie inside this directory [default: KC_LORA_RESOLVER_DIR, else unconfined]."),
    _opt("--max-request-body-bytes", env="KC_MAX_REQUEST_BODY_BYTES", default="8MiB", help="Larger bodies get 413."),
    _opt("--max-n", env="KC_MAX_N", type=int, default=16, help="Largest `n` a request may ask for."),
    _opt("--max-logprobs", env="KC_MAX_LOGPROBS", type=int, default=20, help="Largest logprobs/top_logprobs count."),
    _opt("--max-stop-strings", env="KC_MAX_STOP_STRINGS", type=int, default=16, help="Most stop strings per request."),
    _opt("--max-stop-string-length", env="KC_MAX_STOP_STRING_LENGTH", type=int, default=256,
         help="Longest stop string, in characters."),
    _opt("--max-prompts", env="KC_MAX_PROMPTS", type=int, default=64, help="Most prompts in one completions request."),
    _opt("--structured-outputs-backend", env="KC_STRUCTURED_OUTPUTS_BACKEND", default="auto",
         help="Grammar backend for response_format, structured_outputs, guided_* and forced tool calls: 'auto' "
              "(the first installed backend that supports the request) or a backend name (see `kc plugins`)."),
    _opt("--structured-outputs-compact-whitespace", env="KC_STRUCTURED_OUTPUTS_COMPACT_WHITESPACE", is_flag=True,
         default=False, help="Constrained JSON with no whitespace between tokens. By default a model may put up to "
                             "16 whitespace characters wherever JSON allows (compact output degrades many models' "
                             "answers); a request asks for compact JSON with "
                             "structured_outputs.disable_any_whitespace."),
    _opt("--speculative-config", env="KC_SPECULATIVE_CONFIG", default=None,
         help='Speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": '
              '4, "prompt_lookup_min": 2} (vLLM\'s keys; "method" is any registered proposer, see `kc plugins`). '
              'Outputs are unchanged; a request whose drafts keep failing stops proposing for a while.'),
    _opt("--enable-auto-tool-choice", env="KC_ENABLE_AUTO_TOOL_CHOICE", is_flag=True, default=False,
         help='Serve tool_choice "auto": the model writes calls in its own format, --tool-call-parser extracts them.'),
    _opt("--tool-call-parser", env="KC_TOOL_CALL_PARSER", default=None,
         help="Tool-call format of the model: hermes, llama3_json, mistral, pythonic, or a plugin's parser."),
    _opt("--reasoning-parser", env="KC_REASONING_PARSER", default=None,
         help="Reasoning format (deepseek_r1, qwen3, or a plugin's): thinking goes to reasoning_content."),
    _opt("--request-read-timeout", env="KC_REQUEST_READ_TIMEOUT", type=float, default=30.0,
         help="Seconds a client may take to send a request's headers (then the connection is closed), and its body "
              "(then 408); also how long an idle keep-alive connection stays open."),
    _opt("--shutdown-timeout", env="KC_SHUTDOWN_TIMEOUT", type=float, default=10.0,
         help="Seconds to let in-flight requests finish on SIGTERM/SIGINT before aborting them."),
    _opt("--default-max-tokens", env="KC_DEFAULT_MAX_TOKENS", type=click.IntRange(min=1), default=None,
         show_default=False, help="max_tokens for requests that do not set it. Without it a chat request generates "
         "until the model stops or the context (--max-model-len) is full, as in vLLM, and a completion request "
         "generates 16 tokens, as in OpenAI."),
    _opt("--metrics-prefix", env="KC_METRICS_PREFIX", default="kc",
         help="Prefix of the /metrics names (kc:num_requests_running, ...); `vllm` makes vLLM's dashboards and "
         "alerts work unchanged."),
    _opt("--web-console/--no-web-console", env="KC_WEB_CONSOLE", default=True,
         help="Serve the web console (chat playground and operator console) at / and its JSON endpoints."),
)


def serve_options(command: F) -> F:
    """Declare every `kc serve` option on ``command`` (as its decorators would, in this order)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
