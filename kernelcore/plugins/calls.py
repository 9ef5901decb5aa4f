"""Call a hook one plugin at a time, so a failure names the plugin that raised."""

from __future__ import annotations

import logging
from typing import Any

from kernelcore.plugins.state import PluginError, describe, process_state

logger = logging.getLogger("kernelcore.plugins")


def implementers(hook_name: str) -> list[str]:
    """Plugin names implementing a hook, in the order pluggy calls them."""
    return [impl.plugin_name for impl in reversed(getattr(process_state().pm.hook, hook_name).get_hookimpls())]


def call_each(hook_name: str, **kwargs: Any) -> None:
    """Call a hook's implementations one by one, in pluggy's order.

    One that raises stops the call with a one-line :class:`PluginError` naming the plugin, its
    distribution, the hook and the message; the traceback is logged at debug level.
    """
    for plugin_name in implementers(hook_name):
        try:
            call_plugin_hook(plugin_name, hook_name, **kwargs)
        except Exception as exc:
            logger.debug("%s raised in %s", plugin_name, hook_name, exc_info=True)
            raise PluginError(f"{describe(plugin_name)} failed in {hook_name}: {type(exc).__name__}: {exc}") from exc


def call_plugin_hook(plugin_name: str, hook_name: str, **kwargs: Any) -> Any:
    """Call one plugin's implementation of a hook (traced like any hook call)."""
    pm = process_state().pm
    others = [p for name, p in pm.list_name_plugin() if name != plugin_name and p is not None]
    return pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
