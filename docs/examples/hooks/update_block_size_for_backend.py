from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def update_block_size_for_backend(self, config):
        # Nova's attention kernel tiles 64 tokens; a user's --block-size is left alone.
        if not config.is_user_set("cache.block_size"):
            config.cache.block_size = 64
