"""The OpenAI-compatible HTTP server (aiohttp): app factory in :mod:`.app`, one module per endpoint family."""
