"""`pi-workflows effects list|confirm|retry`: effects in doubt and their resolution."""

from __future__ import annotations

import datetime
from typing import Any

import click

from .context import CliContext, emit_json, json_option, pass_cli
from .json_input import parse_json_text


@click.group("effects")
def effects_group() -> None:
    """List effects and resolve those in doubt (an action that may or may not have happened)."""


@effects_group.command("list")
@click.option("--ambiguous", is_flag=True, help="Only effects in doubt, which need an operator.")
@click.option("--run", "run_id", default=None, help="Only the effects of RUN.")
@json_option
@pass_cli
def list_command(cli_ctx: CliContext, ambiguous: bool, run_id: str | None, as_json: bool) -> None:
    """List effects, newest first: run actions and decision-channel deliveries."""
    found = cli_ctx.client().list_effects(status="ambiguous" if ambiguous else None, run_id=run_id)
    if as_json:
        emit_json(found)
        return
    if not found:
        click.echo("no effects in doubt" if ambiguous else "no effects")
    for effect in found:
        owner = (
            f"run {effect['runId']} node {effect['nodeId']}"
            if effect["scope"] == "run"
            else f"decision {effect['decisionId']} channel {effect['channel']}"
        )
        click.echo(
            f"{effect['effectId']}  {_shown_status(effect)}  {effect['effectType']} "
            f"({effect['policy']}, {effect['attempts']} attempts)  {owner}"
        )
        if effect["status"] == "ambiguous":
            click.echo(
                f"  resolve: pi-workflows effects confirm {effect['effectId']} | "
                f"pi-workflows effects retry {effect['effectId']}"
            )
        elif effect["gaveUp"]:
            click.echo(f"  send it again: pi-workflows effects retry {effect['effectId']}")


def _shown_status(effect: dict[str, Any]) -> str:
    """`rejected` says whether the host tries again by itself or gave up."""
    if effect["gaveUp"]:
        return "rejected (gave up)"
    if effect["nextAttemptAt"] is not None:
        at = datetime.datetime.fromtimestamp(effect["nextAttemptAt"] / 1000, datetime.UTC)
        return f"rejected (retrying at {at:%H:%M:%S}Z)"
    return effect["status"]


def _parse_result(result_json: str | None) -> Any:
    return None if result_json is None else parse_json_text(result_json, "--result-json")


@effects_group.command("confirm")
@click.argument("effect_id")
@click.option(
    "--result-json", default=None, help="What the action produced (JSON); its node gets it."
)
@json_option
@pass_cli
def confirm_command(
    cli_ctx: CliContext, effect_id: str, result_json: str | None, as_json: bool
) -> None:
    """EFFECT_ID did happen: record it as applied; its node completes with that result."""
    receipt = cli_ctx.client().confirm_effect(effect_id, _parse_result(result_json))
    _print_receipt(receipt, as_json)


@effects_group.command("retry")
@click.argument("effect_id")
@json_option
@pass_cli
def retry_command(cli_ctx: CliContext, effect_id: str, as_json: bool) -> None:
    """EFFECT_ID did not happen: its node (or channel) runs the action again."""
    _print_receipt(cli_ctx.client().retry_effect(effect_id), as_json)


def _print_receipt(receipt: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(receipt)
        return
    verb = "confirmed" if receipt["action"] == "confirm" else "will be retried"
    click.echo(f"{receipt['effectId']}: {verb}")
    if receipt["runReleased"]:
        click.echo(f"run {receipt['runId']} carries on")
