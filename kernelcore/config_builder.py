"""Build a KernelConfig from user arguments, calling the platform hooks in order.

Order: general plugins loaded, ``pre_register_and_update()``, HF config + ``hf_overrides`` ->
architecture resolved in the registry, ``apply_config_platform_defaults``, ``check_and_update_config``
(platform last), ``update_block_size_for_backend``, custom-op list validated, ``validate_environ``.
A hook that raises becomes a one-line PluginError naming its plugin.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

from kernelcore.contract.config import (
    CacheConfig,
    DecodingConfig,
    KernelConfig,
    LoraConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    validate_custom_ops,
)

logger = logging.getLogger("kernelcore.config")


def _check_positions(model: ModelConfig, model_cls, hf_config) -> None:
    """Refuse a max_model_len past the positions the model encodes: a longer request would otherwise fail inside
    the forward (a rotary table, a learned position embedding) and take the engine down with it. The limit is the
    model class's optional ``max_positions(hf_config)`` (None: none), else the config's max_position_embeddings."""
    positions_of = getattr(model_cls, "max_positions", None)
    if positions_of is not None:
        limit, source = positions_of(hf_config), "its position encoding"
    else:
        limit, source = getattr(hf_config, "max_position_embeddings", None), "max_position_embeddings of its config"
    if limit is not None and model.max_model_len > limit:
        raise ValueError(f"max_model_len {model.max_model_len} is longer than the {limit} positions "
                         f"{model.architecture} encodes ({source}): lower --max-model-len to {limit} or less")


@functools.lru_cache(maxsize=8)
def _load_hf_config_cached(model_path: str, overrides_json: str):
    from transformers import AutoConfig

    import kernelcore.models.gguf_checkpoint as gguf_checkpoint

    if gguf_checkpoint.is_gguf(model_path):
        hf_config = gguf_checkpoint.hf_config(model_path)
        for key, value in json.loads(overrides_json).items():
            setattr(hf_config, key, value)
        return hf_config
    if not os.path.isdir(model_path):
        raise FileNotFoundError(f"model directory {model_path!r} does not exist "
                                "(kernelcore loads local HF checkpoints only)")
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise FileNotFoundError(f"{model_path!r} has no config.json: not a Hugging Face checkpoint directory")
    hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    for key, value in json.loads(overrides_json).items():
        setattr(hf_config, key, value)
    return hf_config


def load_hf_config(model: ModelConfig):
    """The model's transformers config with ``hf_overrides`` applied (cached per process)."""
    return _load_hf_config_cached(model.model, json.dumps(model.hf_overrides, sort_keys=True))


def _check_gguf(model: ModelConfig) -> None:
    """A GGUF file: its tensors' types must each have a registered ``gguf_<type>`` method (refused by name
    otherwise, before any process starts); ``--quantization`` defaults to ``gguf`` (each layer as stored)."""
    import kernelcore.models.gguf_checkpoint as gguf_checkpoint
    from kernelcore.quantization import get_quantization_registry

    path = model.model
    if path is None or not gguf_checkpoint.is_gguf(path):
        return
    registry = get_quantization_registry()
    gguf_checkpoint.check_tensor_types(path, registry.names())
    if model.quantization is None:
        model.quantization = gguf_checkpoint.QUANTIZATION
        registry.get(model.quantization)


_SECTIONS = (("model", ModelConfig), ("cache", CacheConfig), ("parallel", ParallelConfig),
             ("scheduler", SchedulerConfig), ("lora", LoraConfig))


def _update_block_size(config: KernelConfig) -> None:
    """The platform's block size, chosen once here so the KV manager and every worker agree on it."""
    from kernelcore import plugins

    before = config.cache.block_size
    plugins.call_each("update_block_size_for_backend", config=config)
    after = config.cache.block_size
    if after != before:
        if config.is_user_set("cache.block_size"):
            raise plugins.PluginError(f"the platform changed the user's block size {before} to {after} in "
                                      "update_block_size_for_backend (it may only default an unset one)")
        if not isinstance(after, int) or after < 1:
            raise plugins.PluginError(f"update_block_size_for_backend set block_size={after!r}: not a positive int")
        logger.info("Block size %d chosen by platform %s (was %d)", after, config.platform_plugin, before)


def _split(kwargs: dict[str, Any], cls: Any) -> dict[str, Any]:
    names = set(cls.__dataclass_fields__)
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names and kwargs[k] is not None}


def build_config(**kwargs: Any) -> KernelConfig:
    """Build the config from keyword arguments named like the dataclass fields.

    Unknown keywords raise TypeError. ``model=None`` means the embedded default model.
    """
    from kernelcore import platforms, plugins
    from kernelcore.models.registry import model_registry
    from kernelcore.platforms import current_platform

    platforms.load_general_plugins()
    pm = plugins.get_plugin_manager()
    pm.hook.pre_register_and_update(parser=None)

    kwargs = dict(kwargs)
    if isinstance(kwargs.get("hf_overrides"), str):
        kwargs["hf_overrides"] = json.loads(kwargs["hf_overrides"])
    custom_ops = list(kwargs.pop("custom_ops", None) or [])
    plugin_options = dict(kwargs.pop("plugin_options", None) or {})
    speculative = kwargs.pop("speculative_config", None)
    if not isinstance(speculative, SpeculativeConfig):
        from kernelcore.speculative.proposer import parse_speculative_config

        speculative = parse_speculative_config(speculative)
    user_set = frozenset(f"{section}.{name}" for section, cls in _SECTIONS for name in cls.__dataclass_fields__
                         if kwargs.get(name) is not None)
    model = ModelConfig(**_split(kwargs, ModelConfig))
    if model.quantization is not None:
        from kernelcore.quantization import check_quantization

        check_quantization(model.quantization)
    cache = CacheConfig(**_split(kwargs, CacheConfig))
    parallel = ParallelConfig(**_split(kwargs, ParallelConfig))
    scheduler = SchedulerConfig(**_split(kwargs, SchedulerConfig))
    lora = LoraConfig(**_split(kwargs, LoraConfig))
    decoding = DecodingConfig(**_split(kwargs, DecodingConfig))
    unknown = [k for k, v in kwargs.items() if v is not None]
    if unknown:
        raise TypeError(f"unknown config arguments: {unknown}")

    if model.model is None:
        from kernelcore.models.default_model import describe, ensure_default_model

        model.model = ensure_default_model()
        logger.warning(describe(model.model))
    model.model = os.path.abspath(os.path.expanduser(model.model))
    _check_gguf(model)
    hf_config = load_hf_config(model)
    architectures = list(getattr(hf_config, "architectures", None) or [])
    model.architecture, model_cls = model_registry.resolve(architectures)
    logger.info("Resolved architecture: %s", model.architecture)
    kv_window = getattr(model_cls, "kv_cache_sliding_window", None)  # optional: the model's KV-cache horizon
    cache.sliding_window = kv_window(hf_config) if kv_window is not None else None
    info = model_registry.inspect(model.architecture)
    if (parallel.tensor_parallel_size or 1) > 1 and not info.supports_tensor_parallel:
        raise ValueError(f"{model.architecture} (plugin {model_registry.owners()[model.architecture]}) does not "
                         "support tensor parallelism (supports_tensor_parallel is not set)")
    if lora.enable_lora and not info.supports_lora:
        raise ValueError(f"{model.architecture} (plugin {model_registry.owners()[model.architecture]}) does not "
                         "support LoRA (supports_lora is not set)")
    native_len = getattr(hf_config, "max_position_embeddings", None) or 2048
    if model.max_model_len is None:
        model.max_model_len = native_len
    _check_positions(model, model_cls, hf_config)
    if model.served_model_name is None:
        model.served_model_name = os.path.basename(model.model.rstrip("/")) or model.model

    config = KernelConfig(model=model, cache=cache, parallel=parallel, scheduler=scheduler, lora=lora,
                          decoding=decoding, speculative=speculative, custom_ops=custom_ops,
                          device_type=current_platform.device_type, plugin_options=plugin_options,
                          platform_plugin=current_platform.plugin_name, user_set=user_set)
    plugins.call_each("apply_config_platform_defaults", config=config)
    plugins.call_each("check_and_update_config", config=config)
    _update_block_size(config)
    if config.model.dtype == "auto":
        config.model.dtype = "float32"  # no platform chose one
    if not any(mode in config.custom_ops for mode in ("all", "none")):
        config.custom_ops.append("all")
    validate_custom_ops(config.custom_ops)
    plugins.call_each("validate_environ", config=config)
    if config.parallel.worker_cls == "auto":
        raise RuntimeError(
            f"platform {current_platform.plugin_name!r} ({type(current_platform).__name__}) left worker_cls='auto': "
            "its check_and_update_config hook must set config.parallel.worker_cls to a dotted path")
    _check_data_parallel(config.parallel)
    if config.parallel.world_size % config.parallel.nnodes:
        raise ValueError(f"{config.parallel.world_size} ranks (tensor x pipeline parallel) do not split evenly "
                         f"over {config.parallel.nnodes} nodes")
    if config.scheduler.max_num_batched_tokens < config.scheduler.max_num_seqs:
        config.scheduler.max_num_batched_tokens = config.scheduler.max_num_seqs
    return config


def _check_data_parallel(p: ParallelConfig) -> None:
    local = p.data_parallel_local_ranks
    if len(local) < 1 or local.start < 0 or local.stop > p.data_parallel_size:
        raise ValueError(f"data-parallel ranks {local.start}..{local.stop - 1} on this host are not within the "
                         f"{p.data_parallel_size} replicas (--data-parallel-size-local, --data-parallel-start-rank)")
    if len(local) < p.data_parallel_size:  # some replicas live on other hosts
        if not p.data_parallel_address or not p.data_parallel_rpc_port:
            raise ValueError("replicas on other hosts need --data-parallel-address and --data-parallel-rpc-port")
        if not p.cluster_secret:
            raise ValueError("replicas on other hosts need a shared --cluster-secret (or KC_CLUSTER_SECRET)")
        if p.nnodes > 1:
            raise ValueError("a data-parallel replica spans one host (--nnodes > 1 with replicas on other hosts)")

