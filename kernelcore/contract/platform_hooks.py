"""The platform hooks: detection, the config hooks and the choice of components.

A platform plugin implements :func:`detect_platform`; the other hooks here are methods of the detected
:class:`~kernelcore.contract.platform.Platform` (a general plugin may implement them too). The whole contract,
with the order pluggy calls implementations in, is :mod:`kernelcore.contract.hookspecs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelcore.contract.markers import hookspec

if TYPE_CHECKING:
    from kernelcore.contract.attention import AttentionSelector
    from kernelcore.contract.config import KernelConfig


# -- platform detection ------------------------------------------------------


@hookspec
def detect_platform() -> str | None:
    """Say whether this plugin's device is present.

    Must be cheap: no device initialisation, no heavy imports. A detector
    that raises is logged with its plugin's name and counts as inactive.

    :returns: the dotted path ``"pkg.mod.Class"`` of a
        :class:`~kernelcore.contract.platform.Platform` subclass, or ``None`` when the
        device is absent.

    Every detector is called (not first-result); the core applies the
    detection rules (one out-of-tree platform beats the built-ins, two is an
    error, ``KC_PLATFORM`` overrides).

    Called in: every process, on first access to ``current_platform``.
    """


# -- configuration (platform hooks) -------------------------------------------


@hookspec
def pre_register_and_update(parser: Any | None) -> None:
    """Extend a CLI command before its arguments are parsed.

    Called once per CLI command with the :class:`click.Command` as ``parser``
    (append :class:`click.Option` objects to ``parser.params``), and once more
    with ``parser=None`` when the config is built. Must be idempotent.

    :param parser: the click command about to parse its arguments, or None.

    Called in: the front-end process.
    """


@hookspec
def apply_config_platform_defaults(config: KernelConfig) -> None:
    """Fill platform defaults into a freshly built config, in place.

    Runs after the user's arguments are applied and before the custom-op
    default and :func:`check_and_update_config`. Fields the user did not set
    are ``"auto"`` (``config.model.dtype``) or reported by
    ``config.is_user_set("section.field")``; leave the others alone. A dtype
    still ``"auto"`` after the platform hooks becomes ``"float32"``.

    :param config: the config being built.

    Called in: the front-end process (and any process that builds a config).
    """


@hookspec
def check_and_update_config(config: KernelConfig) -> None:
    """Validate and finish the config: the platform's last word.

    A platform sets ``config.parallel.worker_cls`` (a dotted path) when it is
    ``"auto"``, chooses the custom-op base mode (``config.custom_ops``) and
    anything device specific. May raise to refuse a config.

    :param config: the config being built.

    Called in: the front-end process.
    """


@hookspec
def validate_environ(config: KernelConfig) -> None:
    """Check environment variables the platform depends on; raise if unusable.

    The refusal reaches the user as one line naming the plugin, its distribution,
    this hook and the message (the traceback is logged at debug level).

    :param config: the finished config.

    Called in: the front-end process, after :func:`check_and_update_config`.
    """


@hookspec
def update_block_size_for_backend(config: KernelConfig) -> None:
    """Choose ``config.cache.block_size``: one the platform's attention backend accepts.

    Only change it when the user did not set one (``config.is_user_set("cache.block_size")``
    is False); changing a user's block size is an error. The value chosen here is the one
    the KV-cache manager and every worker use, at any tensor-parallel size.

    :param config: the config being built, after :func:`check_and_update_config`.

    Called in: the front-end process, once, while the config is built (before any
    worker starts).
    """


# -- component selection (platform hooks) --------------------------------------


@hookspec(firstresult=True)
def get_attn_backend_cls(selector: AttentionSelector) -> str | None:
    """Name the attention backend class for a kind of attention layer.

    Asked once per distinct selector per process (the answer is cached).

    :param selector: head size, dtype, block size, kv-cache dtype, ...
    :returns: a dotted path ``"pkg.mod.Backend"``, or None to pass.

    Stops at first non-None result.

    Called in: every worker, while the model is built.
    """


@hookspec(firstresult=True)
def get_device_communicator_cls() -> str | None:
    """Name the communicator class used by tensor-parallel layers.

    :returns: a dotted path to a :class:`~kernelcore.distributed.Communicator`
        subclass, or None to pass.

    Stops at first non-None result.

    Called in: every worker, when the tensor-parallel group is set up.
    """


@hookspec(firstresult=True)
def get_graph_capture_backend_cls(config: KernelConfig) -> str | None:
    """Name the class that records and replays the decode forward (CUDA graphs on the CUDA platform, tapes of
    kernel launches on the CPU platform).

    When it names one, the model runner captures the forward of an all-decode batch for each size in
    ``config.model.graph_capture_sizes`` (up to the backend's ``max_capture_size``; a speculative
    verification's ``num_speculative_tokens + 1`` rows past it) once the KV cache is
    allocated, and replays the nearest larger one for every decode step that fits; prefill, mixed and LoRA
    steps run eagerly. Not asked when ``config.model.enforce_eager`` is set. The platform's attention
    backend must then read per-step lengths from the metadata's device tensors only (a graph freezes host
    values).

    :param config: the worker's config.
    :returns: a dotted path to a :class:`~kernelcore.executor.graph_runner.GraphCaptureBackend`
        subclass (built with no arguments), or None to run every step eagerly.

    Stops at first non-None result.

    Called in: every worker, after the KV cache is allocated.
    """
