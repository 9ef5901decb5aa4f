"""An endpoint plugin: GET /plugins/dummy/info says which platform serves; POST /plugins/dummy/ask is a tiny API
family of its own on the shared request path (its own request and error shapes)."""

from kernelcore import hookimpl


@hookimpl
def register_endpoints(app, engine):
    from aiohttp import web

    from kernelcore.entrypoints.server.errors import set_error_format
    from kernelcore.entrypoints.server.generate import start_chat
    from kernelcore.entrypoints.server.state import read_json
    from kernelcore.platforms import current_platform

    async def info(request):
        return web.json_response({"platform": current_platform.device_name,
                                  "block_size": engine.config.cache.block_size})

    async def ask(request):
        body = await read_json(request)
        run = await start_chat(request, {"messages": [{"role": "user", "content": body.get("q")}],
                                         "max_tokens": body.get("max_tokens", 8), "temperature": 0})
        (choice,) = await run.result()
        return web.json_response({"answer": choice.content, "tokens": run.num_completion_tokens,
                                  "finish": choice.finish_reason})

    app.router.add_get("/plugins/dummy/info", info)
    app.router.add_post("/plugins/dummy/ask", ask)
    set_error_format(app, "/plugins/dummy/ask", lambda error: {"problem": error.message, "status": error.status})
