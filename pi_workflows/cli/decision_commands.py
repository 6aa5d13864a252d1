"""`pi-workflows decision list|answer` (channel effects: `pi-workflows effects`)."""

from __future__ import annotations

import sys

import click

from .context import CliContext, emit_json, json_option, pass_cli


@click.group("decision")
def decision_group() -> None:
    """List and answer human decisions."""


@decision_group.command("list")
@click.option("--all", "include_resolved", is_flag=True, help="Include resolved decisions.")
@json_option
@pass_cli
def list_command(cli_ctx: CliContext, include_resolved: bool, as_json: bool) -> None:
    """List pending human decisions (with --all, resolved ones too), newest first."""
    found = cli_ctx.client().list_decisions(include_resolved=include_resolved)
    if as_json:
        emit_json(found)
        return
    if not found:
        click.echo("no pending decisions")
    for decision in found:
        click.echo(f"{decision['decisionId']}  {decision['status']}  {decision['title']}")
        click.echo(f"  run {decision['runId']}  node {decision['nodeId']}")
        for key, choice in decision["choices"].items():
            text_input = choice.get("input")
            extra = f"  (--input: {text_input['prompt']})" if text_input else ""
            click.echo(f"  {key}: {choice['label']}{extra}")
        if decision["deadline"]:
            default = (decision["defaultResponse"] or {}).get("choice")
            click.echo(f"  deadline {decision['deadline']}, then: {default}")
        if decision["resolution"]:
            click.echo(f"  resolved by {decision['resolution']['provenance']}")


@decision_group.command("answer")
@click.argument("decision_id")
@click.argument("choice")
@click.option("--input", "text", default=None, help="Text for a choice that asks for input.")
@json_option
@pass_cli
def answer_command(
    cli_ctx: CliContext, decision_id: str, choice: str, text: str | None, as_json: bool
) -> None:
    """Answer DECISION_ID with CHOICE; a late answer is told who won, and when."""
    response = cli_ctx.client().answer_decision(decision_id, choice, text)
    if as_json:
        emit_json(
            {"outcome": response.outcome, "receipt": response.receipt, "error": response.error}
        )
    elif response.ok:
        continuation = (response.receipt or {}).get("continuationRunId")
        suffix = f"; continuation {continuation}" if continuation else ""
        click.echo(f"{decision_id}: {response.outcome}{suffix}")
    else:
        click.echo(f"pi-workflows: {response.error}", err=True)
    if not response.ok:
        sys.exit(1)
