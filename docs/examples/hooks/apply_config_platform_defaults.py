from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def apply_config_platform_defaults(self, config):
        if config.model.dtype == "auto":  # the user did not choose one
            config.model.dtype = "bfloat16"
        if not config.is_user_set("scheduler.max_num_seqs"):
            config.scheduler.max_num_seqs = 64
