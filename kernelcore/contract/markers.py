"""The pluggy markers of the kernelcore project: ``@hookspec`` declares a hook, ``@hookimpl`` implements one."""

import pluggy

hookspec = pluggy.HookspecMarker("kernelcore")
hookimpl = pluggy.HookimplMarker("kernelcore")
