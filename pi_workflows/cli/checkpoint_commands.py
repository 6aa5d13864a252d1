"""`pi-workflows checkpoint answer RUN --input-json JSON`."""

from __future__ import annotations

import json

import click

from ..errors import InvalidInputError
from .context import CliContext, emit_json, json_option, pass_cli


@click.group("checkpoint")
def checkpoint_group() -> None:
    """Answer runs that wait at a checkpoint."""


@checkpoint_group.command("answer")
@click.argument("run_id")
@click.option("--input-json", required=True, help="The answer, as a JSON value.")
@json_option
@pass_cli
def answer_command(cli_ctx: CliContext, run_id: str, input_json: str, as_json: bool) -> None:
    """Answer RUN_ID's checkpoint; a continuation run carries the answer on."""
    try:
        answer = json.loads(input_json)
    except json.JSONDecodeError as error:
        raise InvalidInputError(
            f"--input-json is not valid JSON ({error.msg} at position {error.pos})."
        ) from None
    receipt = cli_ctx.client().answer_checkpoint(run_id, answer)
    if as_json:
        emit_json(receipt)
    elif receipt.get("alreadyAnswered"):
        click.echo(f"{run_id}: already answered; continuation {receipt['runId']}")
    else:
        click.echo(receipt["runId"])
