"""`kc run-batch -i in.jsonl -o out.jsonl [MODEL]`: run an OpenAI batch file through the server's own routes.

The real app (`create_app`, as `kc serve` builds it) listens on an ephemeral loopback port behind a random API
key only this process knows; each line's body is POSTed to it, so validation, limits, chat templates, tools,
structured outputs and errors are exactly the server's. Lines run concurrently (the engine batches them) and
are written in input order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import sys
from collections.abc import AsyncIterator
from typing import IO, Any

import click

from kernelcore.entrypoints.batch_file import BatchRequest, LineError, new_request_id, output_line, parse_lines
from kernelcore.entrypoints.serve import serve_cmd
from kernelcore.entrypoints.serve_config import (
    build_engine_config,
    build_server_options,
    check_model_options,
    check_topology,
)

logger = logging.getLogger("kernelcore.run_batch")

# `kc serve` options that mean the same here, shared (not copied) so their help, defaults and env vars match.
SERVE_PARAMS = (
    "model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "distributed_executor_backend",
    "max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory", "kv_cache_dtype",
    "dtype",
    "quantization", "tokenizer", "num_threads", "hf_overrides", "chat_template", "trust_request_chat_template",
    "allow_special_tokens_in_content", "max_choices", "response_role", "served_model_name", "enable_prefix_caching",
    "seed", "enforce_eager", "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "lora_modules",
    "max_request_body_bytes", "max_n", "max_logprobs", "max_stop_strings", "max_stop_string_length", "max_prompts",
    "structured_outputs_backend", "structured_outputs_compact_whitespace", "speculative_config",
    "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser",
    "default_max_tokens")


@click.command("run-batch", context_settings={"max_content_width": 120})
@click.option("--input-file", "-i", required=True, metavar="PATH",
              help="Batch file, one JSON request per line ('-' reads stdin).")
@click.option("--output-file", "-o", required=True, metavar="PATH",
              help="Where the results go, one JSON line per input line, in input order ('-' writes stdout).")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=64, show_default=True,
              help="Most lines in flight at once (the engine batches them).")
@click.option("--no-progress", is_flag=True, default=False,
              help="No progress bar (there is one only when stderr is a terminal).")
def run_batch_cmd(input_file: str, output_file: str, max_concurrency: int, no_progress: bool,
                  **options: Any) -> None:
    """Run the OpenAI batch file (/v1/chat/completions and /v1/completions lines) through MODEL (a local Hugging
    Face checkpoint directory or a .gguf file; default: the embedded demo model) and write one result line per
    input line. A line that fails (bad JSON, unknown url, a request the server refuses) fails alone; the exit
    status is 0 once the file is processed. Platform plugins may add options of their own.
    """
    items = parse_lines(_read_lines(input_file))
    with _open_output(output_file) as out:  # before the config: a bad path fails before any model is read
        config, server_options = _build(options)
        progress = not no_progress and sys.stderr.isatty()
        try:
            ok, failed = asyncio.run(_main(config, server_options, items, out, max_concurrency, progress))
        except asyncio.CancelledError:  # SIGTERM: the engine is already shut down
            raise click.ClickException("stopped by SIGTERM; the output holds the lines finished so far") from None
    where = "stdout" if output_file == "-" else output_file
    click.echo(f"{len(items)} line(s) written to {where}: {ok} succeeded, {failed} failed", err=True)


setattr(run_batch_cmd, "kc_engine_args", True)  # KcGroup lets the platform extend it (pre_register_and_update)


def _mount_serve_params() -> None:
    params = {p.name: p for p in serve_cmd.params}
    missing = [name for name in SERVE_PARAMS if name not in params]
    if missing:  # a renamed serve option must fail the tests loudly, not turn into a silent default here
        raise RuntimeError(f"kc run-batch shares options kc serve no longer has: {', '.join(missing)}")
    run_batch_cmd.params.extend(params[name] for name in SERVE_PARAMS)


_mount_serve_params()


def _read_lines(path: str) -> list[str]:
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
        text = raw.decode("utf-8-sig")
    except OSError as exc:
        raise click.ClickException(f"cannot read the input file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"the input file {path!r} is not UTF-8 text: {exc}") from None
    # Split on \n only: U+2028 and friends may stand raw inside a JSON string.
    return [line.rstrip("\r") for line in text.split("\n")]


@contextlib.contextmanager
def _open_output(path: str) -> Any:
    if path == "-":
        yield sys.stdout
        return
    try:
        out = open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write the output file {path!r}: {exc.strerror or exc}") from None
    with out:
        yield out


def _build(o: dict[str, Any]) -> tuple[Any, Any]:
    """The engine config and the server's options from `kc serve`'s flags, checked as `kc serve` checks them."""
    template = check_model_options(o)
    check_topology(1, 0, None, None, False, o["distributed_executor_backend"], o["data_parallel_size"] or 1)
    click.echo(f"Starting kernelcore for {o['model'] or 'the embedded default model'}...", err=True)
    platform_options = {k: v for k, v in o.items() if k not in SERVE_PARAMS}
    config = build_engine_config(o, template, platform_options)
    # The port is loopback, but other local users must not borrow it.
    options = build_server_options(o, config, template, api_key=secrets.token_urlsafe(32), web_console=False)
    return config, options


async def _main(config: Any, options: Any, items: list[BatchRequest | LineError], out: IO[str], concurrency: int,
                progress: bool) -> tuple[int, int]:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is not None:  # SIGINT already cancels it (asyncio.run); SIGTERM too, so the engine shuts down
        loop.add_signal_handler(signal.SIGTERM, main.cancel)
    if not any(isinstance(item, BatchRequest) for item in items):  # nothing for the engine: no model to load
        return await send_all("", options.api_key, items, out, concurrency, progress)
    async with local_server(config, options) as base_url:
        return await send_all(base_url, options.api_key, items, out, concurrency, progress)


@contextlib.asynccontextmanager
async def local_server(config: Any, options: Any) -> AsyncIterator[str]:
    """The engine and the app, as `run_server` starts them, on 127.0.0.1 at a free port; yields the base URL."""
    from aiohttp import web

    from kernelcore import plugins
    from kernelcore.engine.async_llm import AsyncLLM
    from kernelcore.entrypoints.first_run import startup_warnings
    from kernelcore.entrypoints.server.app import create_app
    from kernelcore.lora.adapter import LoRAAdapterError
    from kernelcore.metrics import make_stat_loggers
    from kernelcore.metrics.prometheus import PrometheusStatLogger

    prometheus = PrometheusStatLogger(config, prefix=options.metrics_prefix)
    logger.info("Starting the engine (loading weights, allocating the KV cache)...")
    engine = await AsyncLLM.create(config, stat_loggers=make_stat_loggers(config, [prometheus]))
    runner = None
    try:
        startup_warnings(engine, options)
        prometheus.set_components(plugins.report_components())  # logged, and on /metrics
        try:
            app = await create_app(engine, options, prometheus)
        except LoRAAdapterError as exc:  # only the static --lora-modules are loaded before the first line
            raise click.BadParameter(str(exc), param_hint="--lora-modules") from None
        except ValueError as exc:  # e.g. --enable-auto-tool-choice without --tool-call-parser
            raise click.UsageError(str(exc)) from None
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=options.read_timeout)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        if runner is not None:
            await runner.cleanup()  # cancels handlers still running; each aborts its engine request
        await engine.shutdown()


async def send_all(base_url: str, api_key: str, items: list[BatchRequest | LineError], out: IO[str],
                   concurrency: int, progress: bool) -> tuple[int, int]:
    """POST every request (at most ``concurrency`` at once), write each result line in input order; (ok, failed)."""
    import aiohttp
    from tqdm import tqdm

    loop = asyncio.get_running_loop()
    results: list[asyncio.Future[tuple[str, bool]]] = [loop.create_future() for _ in items]
    pending = iter(range(len(items)))
    bar = tqdm(total=len(items), unit="line", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    # No total timeout: a long generation is not a failure; the server's own limits bound each request.
    session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {api_key}"},
                                    timeout=aiohttp.ClientTimeout(total=None),
                                    connector=aiohttp.TCPConnector(limit=concurrency))

    async def worker() -> None:
        for index in pending:  # one iterator shared by the workers: each line is taken once
            results[index].set_result(await _run_line(session, base_url, items[index]))
            bar.update()

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(items)))]
    ok = failed = 0
    try:
        for future in results:
            line, good = await future
            out.write(line + "\n")
            out.flush()  # finished lines reach the file even if the run is stopped later
            ok, failed = ok + good, failed + (not good)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await session.close()
        bar.close()
    return ok, failed


async def _run_line(session: Any, base_url: str, item: BatchRequest | LineError) -> tuple[str, bool]:
    """(output line, whether it succeeded) for one input line; never raises but for cancellation."""
    import aiohttp

    request_id = new_request_id()
    if isinstance(item, LineError):
        return output_line(request_id, item.custom_id, error=item), False
    try:
        async with session.post(base_url + item.url, json=item.body, headers={"X-Request-Id": request_id}) as r:
            try:
                body = await r.json(content_type=None)
            except ValueError:
                body = await r.text()
            return output_line(request_id, item.custom_id, r.status, body), r.status == 200
    except (aiohttp.ClientError, OSError) as exc:  # the request never got an answer (e.g. the engine died)
        error = LineError(item.custom_id, "request_failed", f"{type(exc).__name__}: {exc}")
        return output_line(request_id, item.custom_id, error=error), False
    except Exception as exc:  # e.g. a body json cannot encode; one line's bug must not hang the file
        logger.exception("Line %r failed", item.custom_id)
        error = LineError(item.custom_id, "internal_error", f"{type(exc).__name__}: {exc}")
        return output_line(request_id, item.custom_id, error=error), False

