"""`pi-workflows checkpoint answer RUN --input-json JSON | --input-file PATH`."""

from __future__ import annotations

import click

from .context import CliContext, emit_json, json_option, pass_cli
from .json_input import NOTHING, input_options, read_json_input


@click.group("checkpoint")
def checkpoint_group() -> None:
    """Answer runs that wait at a checkpoint."""


@checkpoint_group.command("answer")
@click.argument("run_id")
@input_options
@json_option
@pass_cli
def answer_command(
    cli_ctx: CliContext, run_id: str, input_json: str | None, input_file: str | None, as_json: bool
) -> None:
    """Answer RUN_ID's checkpoint; a continuation run carries the answer on."""
    answer = read_json_input(input_json, input_file, "The checkpoint answer")
    if answer is NOTHING:
        raise click.UsageError("Give the answer with --input-json or --input-file.")
    receipt = cli_ctx.client().answer_checkpoint(run_id, answer)
    if as_json:
        emit_json(receipt)
    elif receipt.get("alreadyAnswered"):
        click.echo(f"{run_id}: already answered; continuation {receipt['runId']}")
    else:
        click.echo(receipt["runId"])
