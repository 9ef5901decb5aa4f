import click

from kernelcore import hookimpl
from kernelcore.platforms import Platform


class NovaPlatform(Platform):
    @hookimpl
    def pre_register_and_update(self, parser):
        # Idempotent: called once per CLI command and again with parser=None.
        if parser is not None and not any(p.name == "nova_cores" for p in parser.params):
            parser.params.append(click.Option(["--nova-cores"], type=int, default=8, help="Nova cores per rank."))
