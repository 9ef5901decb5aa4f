"""The configs, kept importable here: they live in :mod:`kernelcore.contract.config`."""

from kernelcore.contract.config import (
                                        CacheConfig,
                                        DecodingConfig,
                                        KernelConfig,
                                        LoraConfig,
                                        ModelConfig,
                                        ParallelConfig,
                                        SchedulerConfig,
                                        SpeculativeConfig,
                                        get_current_config,
                                        set_current_config,
                                        validate_custom_ops,
)

__all__ = ["CacheConfig", "DecodingConfig", "KernelConfig", "LoraConfig", "ModelConfig", "ParallelConfig",
           "SchedulerConfig", "SpeculativeConfig", "get_current_config", "set_current_config", "validate_custom_ops"]
