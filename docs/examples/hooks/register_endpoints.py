# Enabled with `kc serve --endpoint-plugins nova_endpoints` (or KC_ENDPOINT_PLUGINS=nova_endpoints).
from kernelcore import hookimpl


@hookimpl
def register_endpoints(app, engine):
    from aiohttp import web

    async def status(request):
        return web.json_response({"running": engine.num_requests_running, "waiting": engine.num_requests_waiting})

    app.router.add_get("/plugins/nova/status", status)
