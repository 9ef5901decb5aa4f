from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"
