"""`pi-workflows pi ...`: the Pi coding agent side of a workflow session (SPEC §16).

`extension-path`, `install`, `uninstall` and `doctor` are for people; `socket` and
`start-payload` are what the interactive extension asks the CLI, so that finding (and
autostarting) the host and resolving workflows stay in Python.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pi_workflows.plugin import (
    AgentExecutorError,
    CliContext,
    HostConnection,
    HostUnavailableError,
    InvalidInputError,
    emit_json,
    json_option,
    pass_cli,
    start_payload,
)

from . import doctor, install
from .executor import PiSettings
from .node import SESSION_EXTENSION


@click.group("pi")
def pi_group() -> None:
    """The Pi coding agent: its workflow-session extension and set-up checks."""


@pi_group.command("extension-path")
def extension_path_command() -> None:
    """Print the entry file of the Pi extension (`pi install` lists it in Pi's settings)."""
    click.echo(str(SESSION_EXTENSION))


@pi_group.command("socket")
@json_option
@pass_cli
def socket_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Print the socket of this home's host, starting the host unless --no-autostart."""
    connection = cli_ctx.client().connection
    found = {
        "socketPath": str(cli_ctx.home.socket_path),
        "packageVersion": connection.hello.get("packageVersion"),
    }
    if as_json:
        emit_json(found)
    else:
        click.echo(found["socketPath"])


@pi_group.command("start-payload")
@click.argument("workflow")
@click.option("--input-json", default=None, help="The run's input as a JSON value.")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Project directory (default: the current directory).",
)
def start_payload_command(workflow: str, input_json: str | None, project: Path | None) -> None:
    """Print the `run.start` payload for WORKFLOW; the session adds itself as origin."""
    run_input = {}
    if input_json is not None:
        try:
            run_input = json.loads(input_json)
        except json.JSONDecodeError as error:
            raise InvalidInputError(
                f"The input is not valid JSON ({error.msg} at position {error.pos}); "
                'give an object such as {"goal": "ship it"}.'
            ) from None
    payload = start_payload(workflow, (project or Path.cwd()).resolve(), run_input)
    emit_json(payload)


def _check_host(cli_ctx: CliContext) -> tuple[bool, str]:
    try:
        HostConnection(cli_ctx.home.socket_path, timeout_s=5).close()
    except HostUnavailableError:
        return True, f"host: not running for {cli_ctx.home.root} (the extension starts it)"
    return True, f"host: ok (running for {cli_ctx.home.root})"


@pi_group.command("install")
@click.option(
    "--bin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to link `pi` (default: this Python environment's scripts directory).",
)
def install_command(bin_dir: Path | None) -> None:
    """Make plain `pi` load the workflow-session extension, and put `pi` on PATH."""
    for line in install.install(bin_dir or install.default_bin_dir()):
        click.echo(line)


@pi_group.command("uninstall")
def uninstall_command() -> None:
    """Undo what `pi-workflows pi install` did (and nothing else)."""
    for line in install.uninstall():
        click.echo(line)


@pi_group.command("doctor")
@pass_cli
def doctor_command(cli_ctx: CliContext) -> None:
    """Check Node, pi, the extension, Pi's models and provider, the host; one line each."""
    settings: PiSettings | AgentExecutorError
    try:
        settings = PiSettings.from_environment()
    except AgentExecutorError as error:
        settings = error
    results = [
        doctor.check_node(),
        doctor.check_pi(settings),
        doctor.check_pi_on_path(),
        doctor.check_extension(Path.cwd()),
    ]
    if isinstance(settings, AgentExecutorError):
        results.append((False, f"model: not checked ({settings})"))
    else:
        results += doctor.check_models(settings)
    results.append(_check_host(cli_ctx))
    for _, line in results:
        click.echo(line)
    if not all(ok for ok, _ in results):
        sys.exit(1)
