"""From `kc serve`'s parsed options to what a server runs on: the engine config and the server's options.

`kc serve` and `kc run-batch` (which shares most of the options) both build theirs here, so they check and read the
options alike. Each refusal is a usage error naming the option, raised before any engine process starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import click

from kernelcore.entrypoints.serve_options import parse_size, parse_speculative_option

# Options that reach build_config as they are.
ENGINE_KEYS = ("max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens", "dtype", "kv_cache_dtype",
               "quantization", "num_threads", "hf_overrides", "tensor_parallel_size", "pipeline_parallel_size",
               "data_parallel_size", "distributed_executor_backend", "seed", "enable_prefix_caching",
               "served_model_name", "max_loras", "max_lora_rank", "max_cpu_loras", "structured_outputs_backend")


def check_model_options(o: Mapping[str, Any]) -> str | None:
    """Check --chat-template and --quantization; the chat template, loaded."""
    from kernelcore.entrypoints.server.chat_template import load_chat_template

    try:
        template = load_chat_template(o["chat_template"])
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--chat-template") from None
    if o["quantization"] is not None:
        from kernelcore.quantization import check_quantization

        try:
            check_quantization(o["quantization"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--quantization") from None
    return template


def check_topology(nnodes: int, node_rank: int, master_addr: str | None, cluster_secret: str | None,
                   headless: bool, backend: str | None, data_parallel_size: int, dp_remote: bool = False,
                   dp_address: str | None = None, dp_start_rank: int = 0) -> None:
    """Check the executor backend and the multi-host flags against each other."""
    if backend is not None:
        from kernelcore.executor.registry import UnknownExecutorError, build_registry

        try:
            build_registry().get_backend(backend)
        except UnknownExecutorError as exc:
            raise click.BadParameter(str(exc), param_hint="--distributed-executor-backend") from None
    if data_parallel_size > 1 and nnodes > 1:
        raise click.BadParameter("a data-parallel replica spans one host (spread replicas over hosts with "
                                 "--data-parallel-size-local and --headless instead)",
                                 param_hint="--data-parallel-size")
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


def build_engine_config(o: Mapping[str, Any], template: str | None, plugin_options: dict[str, Any],
                        **placement: Any) -> Any:
    """The engine config from the options; ``placement`` adds `kc serve`'s multi-host settings."""
    from kernelcore.config_builder import build_config
    from kernelcore.models.gguf_checkpoint import GGUFError

    try:
        return build_config(
            model=o["model"], kv_cache_memory=parse_size(o["kv_cache_memory"]), chat_template=template,
            plugin_options=plugin_options, enable_lora=o["enable_lora"] or None,
            enforce_eager=o["enforce_eager"] or None, skip_tokenizer_init=o.get("skip_tokenizer_init") or None,
            structured_outputs_compact_whitespace=o["structured_outputs_compact_whitespace"] or None,
            speculative_config=parse_speculative_option(o["speculative_config"]),
            tokenizer=os.path.abspath(o["tokenizer"]) if o["tokenizer"] else None,
            **{k: o[k] for k in ENGINE_KEYS}, **placement)
    except GGUFError as exc:  # e.g. a tensor type no quantization method loads: refused before anything starts
        raise click.ClickException(str(exc)) from None


def build_server_options(o: Mapping[str, Any], config: Any, template: str | None, **fields: Any) -> Any:
    """The server's options: the request limits and the chat settings from the options, ``fields`` for the rest.

    The tokenizer is loaded first: a checkpoint whose tokenizer cannot load is not served.
    """
    from kernelcore.engine.tokenizer import TokenizerError, try_get_tokenizer
    from kernelcore.entrypoints.server.app import ServerOptions
    from kernelcore.entrypoints.server.limits import Limits

    # Only --skip-tokenizer-init lets the tokenizer go: `kc run-batch` has no such option (its lines are text).
    if "skip_tokenizer_init" not in o or not config.model.skip_tokenizer_init:
        try:
            try_get_tokenizer(config.model.tokenizer or config.model.model, required=True)
        except TokenizerError as exc:
            raise click.ClickException(str(exc)) from None
    return ServerOptions(
        served_model_names=[config.model.served_model_name or config.model.model or ""],
        limits=Limits(max_n=o["max_n"], max_logprobs=o["max_logprobs"], max_stop_strings=o["max_stop_strings"],
                      max_stop_string_length=o["max_stop_string_length"], max_prompts=o["max_prompts"],
                      max_choices=o["max_choices"]),
        max_body_bytes=parse_size(o["max_request_body_bytes"]) or 0, chat_template=template,
        trust_request_chat_template=o["trust_request_chat_template"],
        allow_special_tokens_in_content=o["allow_special_tokens_in_content"], response_role=o["response_role"],
        lora_modules=o["lora_modules"], enable_auto_tool_choice=o["enable_auto_tool_choice"],
        tool_call_parser=o["tool_call_parser"], reasoning_parser=o["reasoning_parser"],
        default_max_tokens=o["default_max_tokens"], **fields)
