"""`kc serve [MODEL]`: build the config, start the engine, serve the OpenAI-compatible API until SIGTERM/SIGINT.

The options are declared in :mod:`~kernelcore.entrypoints.serve_options`; the config and the server's options
are built from them in :mod:`~kernelcore.entrypoints.serve_config` (shared with `kc run-batch`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from typing import Any

import click

from kernelcore.entrypoints.serve_config import (
    build_engine_config,
    build_server_options,
    check_model_options,
    check_topology,
)
from kernelcore.entrypoints.serve_options import parse_size, serve_options

__all__ = ["SERVE_OPTION_NAMES", "parse_size", "run_server", "serve_cmd"]

logger = logging.getLogger("kernelcore.serve")


@click.command("serve", context_settings={"max_content_width": 120})
@serve_options
def serve_cmd(**o: Any) -> None:
    """Serve MODEL (a local Hugging Face checkpoint directory or a .gguf file; default: the embedded demo model) over an
    OpenAI-compatible HTTP API. Platform plugins may add options of their own.
    """
    platform_options = {k: v for k, v in o.items() if k not in SERVE_OPTION_NAMES}
    template = check_model_options(o)
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", o["metrics_prefix"]):
        raise click.BadParameter(f"{o['metrics_prefix']!r} is not a metric name prefix (letters, digits, _)",
                                 param_hint="--metrics-prefix")
    host, api_key = o["host"], o["api_key"]
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        logger.warning("Binding %s without --api-key: anyone who can reach this port can use the model", host)
    nnodes, node_rank, headless = o["nnodes"], o["node_rank"], o["headless"]
    dp_local, dp_start_rank = o["data_parallel_size_local"], o["data_parallel_start_rank"]
    dp_remote = dp_local is not None and dp_local < (o["data_parallel_size"] or 1)
    check_topology(nnodes, node_rank, o["master_addr"], o["cluster_secret"], headless,
                   o["distributed_executor_backend"], o["data_parallel_size"] or 1, dp_remote,
                   o["data_parallel_address"], dp_start_rank)
    if headless:  # named before the config is built, so its plugin trace shows it as the node it is
        from kernelcore.hostproc import set_role

        set_role(f"dp-host-{dp_start_rank}" if dp_remote else f"node-{node_rank}")
    click.echo(f"Starting kernelcore for {o['model'] or 'the embedded default model'} (platform, plugins, config)...",
               err=True)
    try:
        config = build_engine_config(
            o, template, platform_options, nnodes=nnodes, node_rank=node_rank,
            master_addr=o["master_addr"] if nnodes > 1 else None,
            master_port=o["master_port"] if nnodes > 1 else None,
            cluster_secret=o["cluster_secret"] if nnodes > 1 or dp_remote else None,
            data_parallel_size_local=dp_local if dp_remote else None,
            data_parallel_start_rank=dp_start_rank if dp_remote else None,
            data_parallel_address=o["data_parallel_address"] if dp_remote else None,
            data_parallel_rpc_port=o["data_parallel_rpc_port"] if dp_remote else None)
    except ValueError as exc:  # a setting the model or the platform refuses: the reason, not a traceback
        logger.debug("config refused", exc_info=True)
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
    options = build_server_options(
        o, config, template, api_key=api_key, enable_endpoint_plugins=o["enable_endpoint_plugins"],
        endpoint_plugins=_names(o["endpoint_plugins"]), disabled_endpoint_plugins=_names(o["disable_endpoint_plugins"]),
        allow_runtime_lora_updating=o["allow_runtime_lora_updating"], lora_root=o["lora_root"],
        read_timeout=o["request_read_timeout"], metrics_prefix=o["metrics_prefix"], web_console=o["web_console"])
    from kernelcore.lora.adapter import LoRAAdapterError

    try:
        asyncio.run(run_server(config, options, host, o["port"], o["shutdown_timeout"]))
    except LoRAAdapterError as exc:  # only the static --lora-modules are loaded before serving
        raise click.BadParameter(str(exc), param_hint="--lora-modules") from None
    sys.exit(0)


# Taken before any platform adds options (pre_register_and_update): the rest of the arguments are the platform's.
SERVE_OPTION_NAMES = frozenset(param.name for param in serve_cmd.params)
setattr(serve_cmd, "kc_engine_args", True)  # KcGroup lets the platform extend it (pre_register_and_update)


def _names(value: str | None) -> list[str]:
    """A comma-separated list of plugin names."""
    return [n.strip() for n in (value or "").split(",") if n.strip()]


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

    from kernelcore import plugins
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
        prometheus.set_components(plugins.report_components())  # logged, and on /metrics
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
