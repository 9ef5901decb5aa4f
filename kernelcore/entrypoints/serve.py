"""`kc serve [MODEL]`: build the config, start the engine, serve the OpenAI-compatible API until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys
from typing import Any

import click

logger = logging.getLogger("kernelcore.serve")

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


def _speculative_config(value: str | None):
    """--speculative-config as a checked SpeculativeConfig (a usage error names the problem)."""
    from kernelcore.speculative.proposer import parse_speculative_config

    try:
        return parse_speculative_config(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--speculative-config") from None


@click.command("serve", context_settings={"max_content_width": 120})
@click.argument("model", required=False, envvar="KC_MODEL")
@_opt("--host", env="KC_HOST", default="127.0.0.1", help="Interface to bind. Binding beyond loopback is explicit.")
@_opt("--port", env="KC_PORT", default=8000, type=int, help="TCP port (0 picks a free one).")
@_opt("--tensor-parallel-size", "-tp", env="KC_TENSOR_PARALLEL_SIZE", type=int, default=None, show_default=False,
      help="Number of tensor-parallel workers [default: 1].")
@_opt("--pipeline-parallel-size", "-pp", env="KC_PIPELINE_PARALLEL_SIZE", type=click.IntRange(min=1), default=None,
      show_default=False, help="Pipeline stages (layers split across them), each of -tp workers [default: 1].")
@_opt("--data-parallel-size", "-dp", env="KC_DATA_PARALLEL_SIZE", type=click.IntRange(min=1), default=None,
      show_default=False, help="Engine replicas behind this API (each with its own -tp x -pp workers), requests "
      "balanced by load with prefix affinity [default: 1].")
@_opt("--data-parallel-size-local", "-dpl", env="KC_DATA_PARALLEL_SIZE_LOCAL", type=click.IntRange(min=1), default=None,
      show_default=False, help="Replicas on this host; the others run on hosts started with --headless "
      "[default: all of --data-parallel-size].")
@_opt("--data-parallel-start-rank", "-dpr", env="KC_DATA_PARALLEL_START_RANK", type=click.IntRange(min=0), default=0,
      help="With --headless: the first data-parallel rank this host runs (the head runs 0..local-1).")
@_opt("--data-parallel-address", "-dpa", env="KC_DATA_PARALLEL_ADDRESS", default=None, show_default=False,
      help="With replicas on other hosts: the head's address; the head binds its data-parallel port to it (only "
      "to it) and the headless hosts' replicas connect there (authenticated with --cluster-secret).")
@_opt("--data-parallel-rpc-port", "-dpp", env="KC_DATA_PARALLEL_RPC_PORT", type=click.IntRange(1, 65535),
      default=29560, help="With replicas on other hosts: the head's data-parallel port (engine-core control).")
@_opt("--distributed-executor-backend", env="KC_DISTRIBUTED_EXECUTOR_BACKEND", default=None, show_default=False,
      help="Executor backend a plugin registered (built-in: uni, mp) [default: uni for one rank, else mp].")
@_opt("--nnodes", env="KC_NNODES", type=click.IntRange(min=1), default=1, help="Hosts this engine spans.")
@_opt("--node-rank", env="KC_NODE_RANK", type=click.IntRange(min=0), default=0,
      help="This host's index: 0 runs the engine and the API, the others run --headless.")
@_opt("--master-addr", env="KC_MASTER_ADDR", default=None, show_default=False,
      help="With --nnodes > 1: the head's address; the head binds its cluster port to it (only to it).")
@_opt("--master-port", env="KC_MASTER_PORT", type=click.IntRange(1, 65535), default=29550,
      help="With --nnodes > 1: the head's cluster port (control, rendezvous).")
@_opt("--cluster-secret", env="KC_CLUSTER_SECRET", default=None, show_default=False,
      help="With --nnodes > 1: shared secret every host proves (HMAC challenge-response); required.")
@_opt("--headless", env="KC_HEADLESS", is_flag=True, default=False,
      help="Run this node's workers only (no API, no engine); needs --nnodes > 1 and --node-rank > 0.")
@_opt("--max-model-len", env="KC_MAX_MODEL_LEN", type=int, default=None, help="Context length [default: the model's].")
@_opt("--block-size", env="KC_BLOCK_SIZE", type=int, default=None, help="KV-cache block size in tokens.")
@_opt("--max-num-seqs", env="KC_MAX_NUM_SEQS", type=int, default=None, help="Most sequences per engine step.")
@_opt("--max-num-batched-tokens", env="KC_MAX_NUM_BATCHED_TOKENS", type=int, default=None,
      help="Token budget per engine step.")
@_opt("--kv-cache-memory", env="KC_KV_CACHE_MEMORY", default=None, help="KV-cache size per rank, e.g. 2GiB.")
@_opt("--dtype", env="KC_DTYPE", default=None, type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
      help="Weight and activation dtype [default: the platform's; float32 on CPU, where 'auto' picks bfloat16 "
           "if the CPU has native bf16].")
@_opt("--quantization", "-q", env="KC_QUANTIZATION", default=None, show_default=False,
      help="Quantize the weights at load: a method a plugin registered (built in: int8, weight-only per-channel; "
           "gguf, each layer as a .gguf file stores it, the default for one; none: a .gguf file dequantized).")
@_opt("--tokenizer", env="KC_TOKENIZER", default=None, show_default=False,
      help="Tokenizer directory (Hugging Face files) [default: the model's own; a .gguf file's embedded vocabulary].")
@_opt("--num-threads", env="KC_NUM_THREADS", type=int, default=None, show_default=False,
      help="Compute threads per worker [default: the CPU cores divided among the ranks].")
@_opt("--skip-tokenizer-init", env="KC_SKIP_TOKENIZER_INIT", is_flag=True, default=False,
      help="Load no tokenizer: serve token-id prompts only, outputs without text (a checkpoint without "
           "tokenizer files is otherwise refused at start-up).")
@_opt("--hf-overrides", env="KC_HF_OVERRIDES", default=None, callback=_json_object,
      help='JSON object applied over the HF config, e.g. \'{"rope_theta": 20000}\'.')
@_opt("--chat-template", env="KC_CHAT_TEMPLATE", default=None,
      help="Chat template: a file path or an inline Jinja string [default: the tokenizer's].")
@_opt("--trust-request-chat-template", env="KC_TRUST_REQUEST_CHAT_TEMPLATE", is_flag=True, default=False,
      help="Let requests bring their own chat_template.")
@_opt("--allow-special-tokens-in-content", env="KC_ALLOW_SPECIAL_TOKENS_IN_CONTENT", is_flag=True, default=False,
      help="Tokenize special-token text inside chat messages as special tokens (by default it is plain text, "
           "so a message cannot forge role markers or end-of-sequence).")
@_opt("--max-choices", env="KC_MAX_CHOICES", type=int, default=64,
      help="Most sequences one request may ask for (prompts x n).")
@_opt("--response-role", env="KC_RESPONSE_ROLE", default="assistant", help="Role of generated chat messages.")
@_opt("--served-model-name", env="KC_SERVED_MODEL_NAME", default=None,
      help="Name clients use for the model [default: the model directory's name].")
@_opt("--api-key", env="KC_API_KEY", default=None, show_default=False,
      help="Require 'Authorization: Bearer KEY' on every route except /health, /ping and /metrics.")
@_opt("--enable-prefix-caching/--no-enable-prefix-caching", env="KC_ENABLE_PREFIX_CACHING", default=None,
      show_default=False, help="Reuse KV blocks of shared prompt prefixes [default: on].")
@_opt("--seed", env="KC_SEED", type=int, default=None, help="Engine random seed.")
@_opt("--enforce-eager", env="KC_ENFORCE_EAGER", is_flag=True, default=False,
      help="Run every step eagerly: capture no decode graphs (CUDA graphs on the CUDA platform).")
@_opt("--enable-endpoint-plugins", env="KC_ENABLE_ENDPOINT_PLUGINS", is_flag=True, default=False,
      help="Let every installed plugin add HTTP routes.")
@_opt("--endpoint-plugins", env="KC_ENDPOINT_PLUGINS", default=None, show_default=False,
      help="Comma-separated plugin names allowed to add HTTP routes (independent of KC_PLUGINS).")
@_opt("--disable-endpoint-plugins", env="KC_DISABLE_ENDPOINT_PLUGINS", default=None, show_default=False,
      help="Comma-separated endpoint plugins to switch off, built-in ones included "
           "(`kc plugins` lists them).")
@_opt("--enable-lora", env="KC_ENABLE_LORA", is_flag=True, default=False, help="Serve LoRA adapters.")
@_opt("--max-loras", env="KC_MAX_LORAS", type=int, default=None, help="Most adapters in one engine step [default: 4].")
@_opt("--max-lora-rank", env="KC_MAX_LORA_RANK", type=int, default=None, help="Largest adapter rank [default: 16].")
@_opt("--max-cpu-loras", env="KC_MAX_CPU_LORAS", type=int, default=None,
      help="Adapters kept loaded in memory per worker (LRU) [default: 8].")
@_opt("--lora-modules", env="KC_LORA_MODULES", multiple=True, callback=_lora_modules, show_default=False,
      help="Adapters loaded at start-up: name=path (repeat the option, or separate with spaces).")
@_opt("--allow-runtime-lora-updating", env="KC_ALLOW_RUNTIME_LORA_UPDATING", is_flag=True, default=False,
      help="Enable /v1/load_lora_adapter, /v1/unload_lora_adapter and resolver lookups of unknown model names.")
@_opt("--lora-root", env="KC_LORA_ROOT", default=None,
      help="Runtime lora_path must lie inside this directory [default: KC_LORA_RESOLVER_DIR, else unconfined].")
@_opt("--max-request-body-bytes", env="KC_MAX_REQUEST_BODY_BYTES", default="8MiB", help="Larger bodies get 413.")
@_opt("--max-n", env="KC_MAX_N", type=int, default=16, help="Largest `n` a request may ask for.")
@_opt("--max-logprobs", env="KC_MAX_LOGPROBS", type=int, default=20, help="Largest logprobs/top_logprobs count.")
@_opt("--max-stop-strings", env="KC_MAX_STOP_STRINGS", type=int, default=16, help="Most stop strings per request.")
@_opt("--max-stop-string-length", env="KC_MAX_STOP_STRING_LENGTH", type=int, default=256,
      help="Longest stop string, in characters.")
@_opt("--max-prompts", env="KC_MAX_PROMPTS", type=int, default=64, help="Most prompts in one completions request.")
@_opt("--structured-outputs-backend", env="KC_STRUCTURED_OUTPUTS_BACKEND", default="auto",
      help="Grammar backend for response_format, structured_outputs, guided_* and forced tool calls: 'auto' "
           "(the first installed backend that supports the request) or a backend name (see `kc plugins`).")
@_opt("--structured-outputs-compact-whitespace", env="KC_STRUCTURED_OUTPUTS_COMPACT_WHITESPACE", is_flag=True,
      default=False, help="Constrained JSON with no whitespace between tokens. By default a model may put up to "
                          "16 whitespace characters wherever JSON allows (compact output degrades many models' "
                          "answers); a request asks for compact JSON with structured_outputs.disable_any_whitespace.")
@_opt("--speculative-config", env="KC_SPECULATIVE_CONFIG", default=None,
      help='Speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": '
           '4, "prompt_lookup_min": 2} (vLLM\'s keys; "method" is any registered proposer, see `kc plugins`). '
           'Outputs are unchanged; a request whose drafts keep failing stops proposing for a while.')
@_opt("--enable-auto-tool-choice", env="KC_ENABLE_AUTO_TOOL_CHOICE", is_flag=True, default=False,
      help='Serve tool_choice "auto": the model writes calls in its own format, --tool-call-parser extracts them.')
@_opt("--tool-call-parser", env="KC_TOOL_CALL_PARSER", default=None,
      help="Tool-call format of the model: hermes, llama3_json, mistral, pythonic, or a plugin's parser.")
@_opt("--reasoning-parser", env="KC_REASONING_PARSER", default=None,
      help="Reasoning format (deepseek_r1, qwen3, or a plugin's): thinking goes to reasoning_content.")
@_opt("--request-read-timeout", env="KC_REQUEST_READ_TIMEOUT", type=float, default=30.0,
      help="Seconds a client may take to send a request's headers (then the connection is closed), and its body "
           "(then 408); also how long an idle keep-alive connection stays open.")
@_opt("--shutdown-timeout", env="KC_SHUTDOWN_TIMEOUT", type=float, default=10.0,
      help="Seconds to let in-flight requests finish on SIGTERM/SIGINT before aborting them.")
@_opt("--default-max-tokens", env="KC_DEFAULT_MAX_TOKENS", type=click.IntRange(min=1), default=None,
      show_default=False, help="max_tokens for requests that do not set it. Without it a chat request generates "
      "until the model stops or the context (--max-model-len) is full, as in vLLM, and a completion request "
      "generates 16 tokens, as in OpenAI.")
@_opt("--metrics-prefix", env="KC_METRICS_PREFIX", default="kc",
      help="Prefix of the /metrics names (kc:num_requests_running, ...); `vllm` makes vLLM's dashboards and "
      "alerts work unchanged.")
@_opt("--web-console/--no-web-console", env="KC_WEB_CONSOLE", default=True,
      help="Serve the web console (chat playground and operator console) at / and its JSON endpoints.")
def serve_cmd(model: str | None, host: str, port: int, tensor_parallel_size: int | None,
              pipeline_parallel_size: int | None, data_parallel_size: int | None,
              data_parallel_size_local: int | None, data_parallel_start_rank: int, data_parallel_address: str | None,
              data_parallel_rpc_port: int,
              distributed_executor_backend: str | None, nnodes: int, node_rank: int, master_addr: str | None,
              master_port: int, cluster_secret: str | None, headless: bool, max_model_len: int | None,
              block_size: int | None, max_num_seqs: int | None, max_num_batched_tokens: int | None,
              kv_cache_memory: str | None, dtype: str | None, quantization: str | None, tokenizer: str | None,
              num_threads: int | None, hf_overrides: dict | None, skip_tokenizer_init: bool, chat_template: str | None,
              trust_request_chat_template: bool, allow_special_tokens_in_content: bool, max_choices: int,
              response_role: str, served_model_name: str | None,
              api_key: str | None, enable_prefix_caching: bool | None, seed: int | None, enforce_eager: bool,
              enable_endpoint_plugins: bool, endpoint_plugins: str | None,
              disable_endpoint_plugins: str | None, enable_lora: bool, max_loras: int | None,
              max_lora_rank: int | None,
              max_cpu_loras: int | None, lora_modules: dict[str, str], allow_runtime_lora_updating: bool,
              lora_root: str | None, max_request_body_bytes: str, max_n: int, max_logprobs: int,
              max_stop_strings: int, max_stop_string_length: int, max_prompts: int, request_read_timeout: float,
              structured_outputs_backend: str, structured_outputs_compact_whitespace: bool,
              speculative_config: str | None, enable_auto_tool_choice: bool, tool_call_parser: str | None,
              reasoning_parser: str | None, shutdown_timeout: float, default_max_tokens: int | None,
              metrics_prefix: str, web_console: bool, **platform_options: Any) -> None:
    """Serve MODEL (a local Hugging Face checkpoint directory or a .gguf file; default: the embedded demo model) over an
    OpenAI-compatible HTTP API. Platform plugins may add options of their own.
    """
    from kernelcore.config_builder import build_config
    from kernelcore.entrypoints.server.app import ServerOptions
    from kernelcore.entrypoints.server.chat_template import load_chat_template
    from kernelcore.entrypoints.server.protocol import Limits

    try:
        template = load_chat_template(chat_template)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--chat-template") from None
    if quantization is not None:
        from kernelcore.quantization import check_quantization

        try:
            check_quantization(quantization)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--quantization") from None
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", metrics_prefix):
        raise click.BadParameter(f"{metrics_prefix!r} is not a metric name prefix (letters, digits, _)",
                                 param_hint="--metrics-prefix")
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        logger.warning("Binding %s without --api-key: anyone who can reach this port can use the model", host)
    dp_remote = data_parallel_size_local is not None and data_parallel_size_local < (data_parallel_size or 1)
    _check_topology(nnodes, node_rank, master_addr, cluster_secret, headless, distributed_executor_backend,
                    data_parallel_size or 1, dp_remote, data_parallel_address, data_parallel_start_rank)
    if headless:  # named before the config is built, so its plugin trace shows it as the node it is
        from kernelcore.hostproc import set_role

        set_role(f"dp-host-{data_parallel_start_rank}" if dp_remote else f"node-{node_rank}")
    click.echo(f"Starting kernelcore for {model or 'the embedded default model'} (platform, plugins, config)...",
               err=True)
    from kernelcore.models.gguf_checkpoint import GGUFError

    try:
        config = build_config(
            model=model, dtype=dtype, max_model_len=max_model_len, block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_memory=parse_size(kv_cache_memory),
            quantization=quantization, num_threads=num_threads, hf_overrides=hf_overrides,
            skip_tokenizer_init=skip_tokenizer_init or None,
            tensor_parallel_size=tensor_parallel_size, seed=seed,
            enable_prefix_caching=enable_prefix_caching, served_model_name=served_model_name, chat_template=template,
            plugin_options=platform_options, enable_lora=enable_lora or None, max_loras=max_loras,
            max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras, enforce_eager=enforce_eager or None,
            pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size,
            distributed_executor_backend=distributed_executor_backend, nnodes=nnodes, node_rank=node_rank,
            master_addr=master_addr if nnodes > 1 else None, master_port=master_port if nnodes > 1 else None,
            cluster_secret=cluster_secret if nnodes > 1 or dp_remote else None,
            data_parallel_size_local=data_parallel_size_local if dp_remote else None,
            data_parallel_start_rank=data_parallel_start_rank if dp_remote else None,
            data_parallel_address=data_parallel_address if dp_remote else None,
            data_parallel_rpc_port=data_parallel_rpc_port if dp_remote else None,
            structured_outputs_backend=structured_outputs_backend,
            structured_outputs_compact_whitespace=structured_outputs_compact_whitespace or None,
            speculative_config=_speculative_config(speculative_config),
            tokenizer=os.path.abspath(tokenizer) if tokenizer else None)
    except GGUFError as exc:  # e.g. a tensor type no quantization method loads: refused before anything starts
        raise click.ClickException(str(exc)) from None
    if headless and dp_remote:
        from kernelcore.engine.dp_remote import run_dp_headless

        sys.exit(run_dp_headless(config))
    if headless:
        from kernelcore.executor.registry import get_executor_cls

        executor_cls = get_executor_cls(config)
        if not hasattr(executor_cls, "run_headless"):
            raise click.UsageError(f"executor backend {executor_cls.__name__} does not run headless nodes")
        sys.exit(executor_cls.run_headless(config))
    from kernelcore.engine.tokenizer import TokenizerError, try_get_tokenizer

    try:  # before any engine process starts: a checkpoint whose tokenizer cannot load is not served
        if not config.model.skip_tokenizer_init:
            try_get_tokenizer(config.model.tokenizer or config.model.model, required=True)
    except TokenizerError as exc:
        raise click.ClickException(str(exc)) from None
    options = ServerOptions(
        served_model_names=[config.model.served_model_name or config.model.model or ""], api_key=api_key,
        limits=Limits(max_n=max_n, max_logprobs=max_logprobs, max_stop_strings=max_stop_strings,
                      max_stop_string_length=max_stop_string_length, max_prompts=max_prompts,
                      max_choices=max_choices),
        max_body_bytes=parse_size(max_request_body_bytes) or 0, chat_template=template,
        trust_request_chat_template=trust_request_chat_template,
        allow_special_tokens_in_content=allow_special_tokens_in_content, response_role=response_role,
        enable_endpoint_plugins=enable_endpoint_plugins,
        endpoint_plugins=[n.strip() for n in (endpoint_plugins or "").split(",") if n.strip()], lora_modules=lora_modules,
        disabled_endpoint_plugins=[n.strip() for n in (disable_endpoint_plugins or "").split(",") if n.strip()],
        allow_runtime_lora_updating=allow_runtime_lora_updating, lora_root=lora_root,
        enable_auto_tool_choice=enable_auto_tool_choice, tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        read_timeout=request_read_timeout, default_max_tokens=default_max_tokens, metrics_prefix=metrics_prefix,
        web_console=web_console)
    from kernelcore.lora.adapter import LoRAAdapterError

    try:
        asyncio.run(run_server(config, options, host, port, shutdown_timeout))
    except LoRAAdapterError as exc:  # only the static --lora-modules are loaded before serving
        raise click.BadParameter(str(exc), param_hint="--lora-modules") from None
    sys.exit(0)


setattr(serve_cmd, "kc_engine_args", True)  # KcGroup lets the platform extend it (pre_register_and_update)


def _check_topology(nnodes: int, node_rank: int, master_addr: str | None, cluster_secret: str | None,
                    headless: bool, backend: str | None, data_parallel_size: int, dp_remote: bool = False,
                    dp_address: str | None = None, dp_start_rank: int = 0) -> None:
    if backend is not None:
        from kernelcore.executor.registry import UnknownExecutorError, build_registry

        try:
            build_registry().get_backend(backend)
        except UnknownExecutorError as exc:
            raise click.BadParameter(str(exc), param_hint="--distributed-executor-backend") from None
    if data_parallel_size > 1 and nnodes > 1:
        raise click.BadParameter("a data-parallel replica spans one host (spread replicas over hosts with "
                                 "--data-parallel-size-local and --headless instead)", param_hint="--data-parallel-size")
    if dp_remote:
        if not dp_address:
            raise click.BadParameter("replicas on other hosts need the head's address",
                                     param_hint="--data-parallel-address")
        if not cluster_secret:
            raise click.BadParameter("replicas on other hosts need a shared secret (or KC_CLUSTER_SECRET): their "
                                     "connections are refused without it", param_hint="--cluster-secret")
        if headless != (dp_start_rank > 0):
            raise click.BadParameter("hosts with --data-parallel-start-rank > 0 run --headless; the head (rank 0) "
                                     "runs the API", param_hint="--headless")
        return
    if node_rank >= nnodes:
        raise click.BadParameter(f"--node-rank {node_rank} must be below --nnodes {nnodes}", param_hint="--node-rank")
    if nnodes > 1:
        if not master_addr:
            raise click.BadParameter("--nnodes > 1 needs the head's address", param_hint="--master-addr")
        if not cluster_secret:
            raise click.BadParameter("--nnodes > 1 needs a shared secret (or KC_CLUSTER_SECRET): cluster "
                                     "connections are refused without it", param_hint="--cluster-secret")
    if headless != (node_rank > 0):
        raise click.BadParameter("nodes with --node-rank > 0 run --headless; node 0 runs the API (not headless)",
                                 param_hint="--headless")


async def _wait_in_flight(state: Any, timeout: float) -> None:
    """Until no request is in flight, or ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while state.num_in_flight and loop.time() < deadline:
        state.in_flight_changed.clear()
        try:
            await asyncio.wait_for(state.in_flight_changed.wait(), deadline - loop.time())
        except asyncio.TimeoutError:
            break


async def run_server(config: Any, options: Any, host: str, port: int, shutdown_timeout: float) -> None:
    from aiohttp import web

    from kernelcore.engine.async_llm import AsyncLLM
    from kernelcore.entrypoints.first_run import startup_warnings
    from kernelcore.entrypoints.server.app import STATE, create_app
    from kernelcore.metrics import make_stat_loggers
    from kernelcore.metrics.prometheus import PrometheusStatLogger

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    prometheus = PrometheusStatLogger(config, prefix=options.metrics_prefix)
    stat_loggers = make_stat_loggers(config, [prometheus])
    logger.info("Starting the engine (loading weights, allocating the KV cache)...")
    engine = await AsyncLLM.create(config, stat_loggers=stat_loggers)
    runner = None
    try:
        startup_warnings(engine, options)
        app = await create_app(engine, options, prometheus)
        state = app[STATE]
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=options.read_timeout)  # also closes a half-sent request
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        logger.info("Serving %s on http://%s:%d (Ctrl-C to stop)", options.served_model_names[0], bound[0], bound[1])
        if options.web_console:
            logger.info("Web console: http://%s:%d/ (chat playground and operator console)", bound[0], bound[1])
        await stop.wait()
        logger.info("Shutting down: no new requests; waiting up to %.1fs for %d in flight", shutdown_timeout,
                    state.num_in_flight)
        state.is_shutting_down = True
        await site.stop()
        await _wait_in_flight(state, shutdown_timeout)
        if state.num_in_flight:
            from kernelcore.entrypoints.server.streaming import SHUTTING_DOWN, ServerShuttingDown

            logger.info("Aborting %d request(s) still in flight", state.num_in_flight)
            engine.fail_all(ServerShuttingDown(SHUTTING_DOWN))  # streams get an error event and [DONE]
            await _wait_in_flight(state, 2.0)  # their handlers only have to write the error out
    finally:
        if runner is not None:
            await runner.cleanup()  # cancels the remaining handlers; each aborts its engine request
        await engine.shutdown()
        logger.info("Engine stopped; bye")
