"""`pi-workflows session ...`: be a workflow session from a terminal or a script (SPEC §9).

Each command opens the reference session client for one session, does its part of the
session protocol (docs/sessions.md) and closes it. A command that reports turns becomes
the session's coordinator for its duration, which fences any other coordinator.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .context import SECONDS, CliContext, emit_json, json_option, pass_cli
from .json_input import parse_json_text


def _client(cli_ctx: CliContext, session_id: str, *, coordinator: bool) -> Any:
    from ..client.session_client import SessionClient

    client = SessionClient(
        cli_ctx.home,
        session_id,
        database_url=cli_ctx.database_url,
        autostart=cli_ctx.autostart,
        coordinator=coordinator,
    )
    client.open()
    return client


@click.group("session")
def session_group() -> None:
    """Act as a workflow session: messages, step prompts, turns and outputs."""


@session_group.command("messages")
@click.argument("session_id", metavar="SESSION")
@json_option
@pass_cli
def messages_command(cli_ctx: CliContext, session_id: str, as_json: bool) -> None:
    """List SESSION's workflow messages, in order (the newest 64 and every open one)."""
    client = _client(cli_ctx, session_id, coordinator=False)
    try:
        messages = client.view["workflowMessages"]
        omitted = client.view.get("workflowMessagesOmitted", 0)
    finally:
        client.close()
    if as_json:
        emit_json(
            [
                {
                    key: m[key]
                    for key in (
                        "workflowMessageId",
                        "runId",
                        "kind",
                        "status",
                        "order",
                        "content",
                        "details",
                    )
                }
                for m in messages
            ]
        )
        return
    if omitted:
        click.echo(f"({omitted} older messages not shown)")
    for m in messages:
        first_line = m["content"].splitlines()[0] if m["content"] else ""
        click.echo(f"{m['order']:>4}  {m['kind']:<12} {m['status']:<9} {first_line[:80]}")


@session_group.command("watch")
@click.argument("session_id", metavar="SESSION")
@click.option("--count", type=int, default=None, help="Stop after COUNT views.")
@click.option("--timeout", type=SECONDS, default=None, help="Stop after SECONDS.")
@pass_cli
def watch_command(
    cli_ctx: CliContext, session_id: str, count: int | None, timeout: float | None
) -> None:
    """Print SESSION's view as JSON lines whenever it changes (Ctrl-C stops)."""
    import time

    client = _client(cli_ctx, session_id, coordinator=False)
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = 0
    last = None
    try:
        while count is None or shown < count:
            if client.view is not last:
                last = client.view
                click.echo(json.dumps(last, sort_keys=True))
                shown += 1
                continue
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                break
            with_change = client._take_events(min(remaining, 3600.0))
            if not with_change and deadline is not None and time.monotonic() >= deadline:
                break
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


@session_group.command("next")
@click.argument("session_id", metavar="SESSION")
@click.option("--timeout", type=SECONDS, default=30.0, show_default=True)
@json_option
@pass_cli
def next_command(cli_ctx: CliContext, session_id: str, timeout: float, as_json: bool) -> None:
    """Show SESSION's next workflow message (a step prompt, say) and record it as shown."""
    client = _client(cli_ctx, session_id, coordinator=True)
    try:
        client.report_branch()
        message = client.deliver_next(timeout_s=timeout)
    finally:
        client.close()
    if as_json:
        emit_json(message)
    else:
        click.echo(message["content"])


@session_group.command("respond")
@click.argument("session_id", metavar="SESSION")
@click.option("--output-json", default=None, help="The step output to submit, as JSON.")
@click.option(
    "--stop-reason",
    type=click.Choice(["completed", "error", "aborted"]),
    default="completed",
    show_default=True,
    help="How the model turn ended.",
)
@click.option("--timeout", type=SECONDS, default=30.0, show_default=True)
@pass_cli
def respond_command(
    cli_ctx: CliContext,
    session_id: str,
    output_json: str | None,
    stop_reason: str,
    timeout: float,
) -> None:
    """Run one model turn on SESSION's open (or next) message and print the receipts.

    With --output-json the turn submits that output for a step; without it the turn
    ends with no submission (an unproductive turn, which earns a reminder).
    """
    output = parse_json_text(output_json, "--output-json") if output_json is not None else None
    client = _client(cli_ctx, session_id, coordinator=True)
    try:
        client.report_branch()
        open_id = client.view.get("openWorkflowMessageId")
        message = client.message(open_id) if open_id else client.deliver_next(timeout_s=timeout)
        result = client.respond(
            message, output, submit=output_json is not None, stop_reason=stop_reason
        )
    finally:
        client.close()
    emit_json({"workflowMessageId": message["workflowMessageId"], **result})
    outcomes = [part.get("outcome") for part in result.values()]
    if any(outcome not in ("accepted", "adopted") for outcome in outcomes):
        sys.exit(1)
