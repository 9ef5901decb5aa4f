"""The kernelcore plugin contract: every hook a plugin may implement.

Plugins reach kernelcore through three entry-point groups:

* ``kernelcore.platform_plugins``: a module (or object) implementing
  :func:`detect_platform`. The detected :class:`~kernelcore.contract.platform.Platform`
  instance is then registered too, so its ``@hookimpl`` methods take part in
  the platform hooks below.
* ``kernelcore.general_plugins``: a module (or object) implementing any of
  the other hooks. Its ``register_*`` hooks run once per process.
* ``kernelcore.stat_logger_plugins``: a :class:`~kernelcore.metrics.StatLoggerBase`
  subclass (not registered with pluggy).

Every process kernelcore starts (front end, ``engine-core``, ``worker-N``)
loads the plugins the same way, before its target runs.

Ordering: pluggy calls implementations last-registered-first. The platform is
registered before any general plugin, so for the non-firstresult config hooks
it runs last and has the last word.
"""

# The hooks are written in two modules, by kind, and gathered here in contract order: pluggy finds them as this
# module's attributes (``pm.add_hookspecs(hookspecs)``) and docs/hooks.md follows the order of its namespace,
# so the import order is the contract order: not sorted.
# isort: off
from kernelcore.contract.markers import hookimpl, hookspec
from kernelcore.contract.platform_hooks import (detect_platform, pre_register_and_update,
                                                apply_config_platform_defaults, check_and_update_config,
                                                validate_environ, update_block_size_for_backend,
                                                get_attn_backend_cls, get_device_communicator_cls,
                                                get_graph_capture_backend_cls)
from kernelcore.contract.general_hooks import (register_ops, register_models, register_kernels,
                                               register_triton_kernel_overrides, register_quantization_methods,
                                               register_endpoints, register_lora_resolvers,
                                               register_executor_backends, register_structured_output_backends,
                                               register_tool_parsers, register_reasoning_parsers,
                                               register_speculative_proposers, report_components)
# isort: on

__all__ = ["hookspec", "hookimpl", "detect_platform", "pre_register_and_update", "apply_config_platform_defaults",
           "check_and_update_config", "validate_environ", "update_block_size_for_backend", "get_attn_backend_cls",
           "get_device_communicator_cls", "get_graph_capture_backend_cls", "register_ops", "register_models",
           "register_kernels", "register_triton_kernel_overrides", "register_quantization_methods",
           "register_endpoints", "register_lora_resolvers", "register_executor_backends",
           "register_structured_output_backends", "register_tool_parsers", "register_reasoning_parsers",
           "register_speculative_proposers", "report_components"]
