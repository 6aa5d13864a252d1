"""`pi-workflows pi ...`: the Pi coding agent side of a workflow session (SPEC §16).

`extension-path` and `doctor` are for people; `socket` and `start-payload` are what the
interactive extension asks the CLI, so that finding (and autostarting) the host and
resolving workflows stay in Python.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click

from pi_workflows.cli.context import CliContext, emit_json, json_option, pass_cli
from pi_workflows.client.connection import HostConnection
from pi_workflows.client.start_request import start_payload
from pi_workflows.errors import HostUnavailableError, InvalidInputError

from .node import DISTRIBUTION_DIR, PINNED_PI_VERSION, SESSION_EXTENSION, pi_command

MIN_NODE_MAJOR = 20
PROBE_TIMEOUT_S = 30


@click.group("pi")
def pi_group() -> None:
    """The Pi coding agent: its workflow-session extension and set-up checks."""


@pi_group.command("extension-path")
def extension_path_command() -> None:
    """Print the entry file of the Pi extension (use: pi -e "$(pi-workflows pi extension-path)")."""
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


def _probe(argv: list[str]) -> str | None:
    """The first line a program prints, or None when it cannot run."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def _check_node() -> tuple[bool, str]:
    version = _probe(["node", "--version"])
    if version is None:
        return False, f"node: not found; install Node.js {MIN_NODE_MAJOR} or newer"
    major = re.match(r"v?(\d+)", version)
    if major is None or int(major.group(1)) < MIN_NODE_MAJOR:
        return False, f"node: {version} is too old; Pi needs Node.js {MIN_NODE_MAJOR} or newer"
    return True, f"node: ok ({version})"


def _check_pi() -> tuple[bool, str]:
    command = pi_command()
    hint = f"run 'npm ci' in {DISTRIBUTION_DIR} or set PI_WORKFLOWS_PI_COMMAND"
    if command is None:
        return False, f"pi: not found; {hint}"
    version = _probe([command, "--version"])
    if version is None:
        return False, f"pi: {command} does not run; {hint}"
    if version != PINNED_PI_VERSION:
        return False, f"pi: {version} at {command}; pi-workflows is tested with {PINNED_PI_VERSION}"
    return True, f"pi: ok ({version} at {command})"


def _check_extension() -> tuple[bool, str]:
    if not SESSION_EXTENSION.is_file():
        return False, f"extension: {SESSION_EXTENSION} is missing; reinstall pi-workflows-pi"
    return True, f"extension: ok ({SESSION_EXTENSION})"


def _check_host(cli_ctx: CliContext) -> tuple[bool, str]:
    try:
        HostConnection(cli_ctx.home.socket_path, timeout_s=5).close()
    except HostUnavailableError:
        return True, f"host: not running for {cli_ctx.home.root} (the extension starts it)"
    return True, f"host: ok (running for {cli_ctx.home.root})"


@pi_group.command("doctor")
@pass_cli
def doctor_command(cli_ctx: CliContext) -> None:
    """Check Node, the pi version, the extension and the host; one line each."""
    results = [_check_node(), _check_pi(), _check_extension(), _check_host(cli_ctx)]
    for _, line in results:
        click.echo(line)
    if not all(ok for ok, _ in results):
        sys.exit(1)
