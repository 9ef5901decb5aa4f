import os

from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def validate_environ(self, config):
        # The user sees one line: "platform plugin 'nova' (distribution nova-kc) failed in validate_environ: ..."
        if os.environ.get("NOVA_VISIBLE_DEVICES") == "":
            raise RuntimeError("NOVA_VISIBLE_DEVICES is empty: no Nova device is visible")
