"""An endpoint plugin: GET /plugins/dummy/info says which platform serves."""

from kernelcore import hookimpl


@hookimpl
def register_endpoints(app, engine):
    from aiohttp import web

    from kernelcore.platforms import current_platform

    async def info(request):
        return web.json_response({"platform": current_platform.device_name,
                                  "block_size": engine.config.cache.block_size})

    app.router.add_get("/plugins/dummy/info", info)
