# `pi-workflows hello-plugin`: a command of the plugin's own.
import click

from pi_workflows.plugin import hookimpl


@click.command("hello-plugin")
def hello_plugin():
    """Say hello from the plugin."""
    click.echo("hello from my plugin")


@hookimpl
def piw_register_commands(cli):
    cli.add_command(hello_plugin)
