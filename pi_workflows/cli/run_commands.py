"""`pi-workflows run start|list|status|transcript|pause|resume|cancel|restart`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..client.workflow_client import WorkflowClient, run_succeeded
from ..lineage import continued_as
from .context import SECONDS, CliContext, emit_json, json_option, pass_cli
from .json_input import NOTHING, input_options, read_json_input


@click.group("run")
def run_group() -> None:
    """Start, list, inspect and control workflow runs."""


def _parse_input(input_json: str | None, input_file: str | None, task: tuple[str, ...]) -> Any:
    value = read_json_input(input_json, input_file, "The run's input")
    if value is not NOTHING:
        return value
    if task:
        return {"task": " ".join(task)}
    return {}


@run_group.command("start")
@click.argument("workflow")
@click.argument("task", nargs=-1)
@input_options
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Project directory (default: the current directory).",
)
@click.option("--session", "session_id", default=None, help="Bind an interactive run to a session.")
@click.option("--headless", is_flag=True, help="Run agent steps through an agent executor.")
@click.option(
    "--priority",
    type=int,
    default=None,
    help="Claim order: higher runs first, whatever their age (default 0).",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until the run is terminal, waiting, or held (paused, say); exit 1 unless it "
    "completed or waits at a checkpoint or decision.",
)
@click.option("--timeout", type=SECONDS, default=None, help="Give up waiting after SECONDS.")
@click.option("--no-autostart", is_flag=True, help="Fail instead of starting a host.")
@json_option
@pass_cli
def start_command(
    cli_ctx: CliContext,
    workflow: str,
    task: tuple[str, ...],
    input_json: str | None,
    input_file: str | None,
    project: Path | None,
    session_id: str | None,
    headless: bool,
    priority: int | None,
    wait: bool,
    timeout: float | None,
    no_autostart: bool,
    as_json: bool,
) -> None:
    """Start WORKFLOW (optionally with TASK text as input) and print its run id."""
    from ..client.start_request import start_payload

    run_input = _parse_input(input_json, input_file, task)
    project_path = (project or Path.cwd()).resolve()
    interactive = session_id is not None and not headless
    payload = start_payload(
        workflow, project_path, run_input, session_id=session_id if interactive else None
    )
    if priority is not None:
        payload["priority"] = priority
    client = cli_ctx.client(autostart=False if no_autostart else None)
    receipt = client.start_run(payload)
    run_id = receipt["runId"]
    if not wait:
        if as_json:
            emit_json(client.known_run_status(run_id))
        else:
            click.echo(run_id)
        return
    if not as_json and sys.stderr.isatty():
        from .progress_display import ProgressDisplay

        display = ProgressDisplay(sys.stderr, live=True)
        autostart = cli_ctx.autostart and not no_autostart
        _follow(cli_ctx, run_id, display.show, display.tick, timeout, autostart=autostart)
        final = client.known_run_status(run_id)
    else:
        final = client.wait_for_run(
            run_id,
            timeout_s=timeout,
            on_progress=None if as_json else _progress_printer(run_id),
        )
    if as_json:
        emit_json(final)
    else:
        _print_outcome(final, client)
    if not run_succeeded(final):
        sys.exit(1)


def _progress_printer(run_id: str) -> Any:
    def show(status: dict[str, Any]) -> None:
        if os.environ.get("PI_WORKFLOWS_PROGRESS"):
            click.echo(f"{run_id}: {status['status']}", err=True)

    return show


def _follow(
    cli_ctx: CliContext,
    run_id: str,
    show: Callable[[dict[str, Any]], None],
    tick: Callable[[], None] | None,
    timeout: float | None,
    *,
    autostart: bool | None = None,
) -> dict[str, Any]:
    """Show the run's progress until it settles; returns the last progress payload."""
    # Imported here, like the progress display: `run list` and `run status` need neither.
    from ..client.run_follower import follow_run

    return follow_run(
        cli_ctx.home,
        run_id,
        show,
        database_url=cli_ctx.database_url,
        autostart=cli_ctx.autostart if autostart is None else autostart,
        on_tick=tick,
        timeout_s=timeout,
    )


@run_group.command("watch")
@click.argument("run_id")
@click.option("--timeout", type=SECONDS, default=None, help="Give up after SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="Print each progress event as a JSON line.")
@pass_cli
def watch_command(cli_ctx: CliContext, run_id: str, timeout: float | None, as_json: bool) -> None:
    """Follow RUN_ID live until it is terminal or waiting (or held until someone acts).

    One line per node attempt, per published update and per change of what holds the
    run; a spinner shows the current step on a terminal. Exit status 0 when the run is
    completed or waits at a checkpoint or decision, 1 otherwise (a held run included).
    """
    if as_json:

        def show(payload: dict[str, Any]) -> None:
            click.echo(json.dumps(payload, sort_keys=True, ensure_ascii=False))

        last = _follow(cli_ctx, run_id, show, None, timeout)
    else:
        from .progress_display import ProgressDisplay

        display = ProgressDisplay(sys.stdout, live=sys.stdout.isatty())
        last = _follow(cli_ctx, run_id, display.show, display.tick, timeout)
    if not run_succeeded(last["status"]):
        sys.exit(1)


def _print_outcome(status: dict[str, Any], client: WorkflowClient) -> None:
    """A run's outcome for a person; a waiting run says what it waits for and the command
    that answers it, instead of the request record (`--json` prints that)."""
    if status["status"] == "waiting":
        _print_waiting(status, client)
        return
    paused = " (paused: resume it with 'pi-workflows run resume')" if status.get("paused") else ""
    click.echo(f"{status['runId']}: {status['status']}{paused}")
    if status.get("statusDetail"):
        click.echo(f"detail: {status['statusDetail']}")
    if status.get("finalOutput") is not None:
        click.echo(json.dumps(status["finalOutput"], indent=2, ensure_ascii=False))
    if status.get("error"):
        click.echo(f"error: {status['error']}", err=True)


def _print_waiting(status: dict[str, Any], client: WorkflowClient) -> None:
    run_id = status["runId"]
    if status.get("continuation"):
        click.echo(f"{run_id}: {continued_as(status['continuation'])}")
        return
    why = client.why_run(run_id)
    output = status.get("finalOutput")
    request: dict[str, Any] = output if isinstance(output, dict) else {}
    # At a decision, the run's output is the decision's request record.
    if why["code"] == "decision" and request.get("decisionId"):
        click.echo(f"{run_id}: waiting for a decision: {request.get('title')}")
        choices = [
            key + (" (with --input TEXT)" if choice.get("input") else "")
            for key, choice in (request.get("choices") or {}).items()
        ]
        click.echo(f"choices: {', '.join(choices)}")
        click.echo(f"answer: pi-workflows decision answer {request['decisionId']} CHOICE")
    elif why["code"] == "checkpoint":
        summary = request.get("summary")
        click.echo(f"{run_id}: waiting at a checkpoint" + (f": {summary}" if summary else ""))
        click.echo(f"answer: pi-workflows checkpoint answer {run_id} --input-json JSON")
    else:
        click.echo(f"{run_id}: {why['reason']}")
        if why["next"]:
            click.echo(f"next: {why['next']}")


@run_group.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, help="At most this many.")
@click.option("--before", "before", metavar="RUN", help="The page after this run (older runs).")
@click.option("--status", help="Only runs of this status (queued, running, waiting, completed, …).")
@click.option("--workflow", help="Only runs of this workflow.")
@json_option
@pass_cli
def list_command(
    cli_ctx: CliContext,
    limit: int,
    before: str | None,
    status: str | None,
    workflow: str | None,
    as_json: bool,
) -> None:
    """List runs, newest first, a page at a time."""
    runs = cli_ctx.client().list_runs(limit, before=before, status=status, workflow=workflow)
    if as_json:
        emit_json(runs)
        return
    if not runs:
        click.echo("no runs")
    for run in runs:
        flag = " (paused)" if run["paused"] else ""
        shown = continued_as(run["continuation"]) if run.get("continuation") else run["status"]
        click.echo(f"{run['runId']}  {run['workflowName']}  {shown}{flag}")
    if len(runs) == limit:
        click.echo(f"more: pi-workflows run list --before {runs[-1]['runId']}")


@run_group.command("status")
@click.argument("run_id")
@json_option
@pass_cli
def status_command(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
    """Show one run's status, output and error."""
    client = cli_ctx.client()
    status = client.known_run_status(run_id)
    if as_json:
        emit_json(status)
        return
    _print_outcome(status, client)
    click.echo(f"queue: {status['queueStatus']}  revision: {status['revision']}")
    if status["paused"]:
        click.echo("paused: yes")
    if status["errorCode"]:
        click.echo(f"error code: {status['errorCode']}")


@run_group.command("why")
@click.argument("run_id")
@json_option
@pass_cli
def why_command(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
    """Say what holds RUN_ID now, and what ends it."""
    why = cli_ctx.client().why_run(run_id)
    if as_json:
        emit_json(why)
        return
    click.echo(f"{run_id}: {why['reason']}")
    if why["next"]:
        click.echo(f"next: {why['next']}")


@run_group.command("transcript")
@click.argument("run_id")
@click.option("--node", "node_id", default=None, help="Only the attempts of this node.")
@json_option
@pass_cli
def transcript_command(
    cli_ctx: CliContext, run_id: str, node_id: str | None, as_json: bool
) -> None:
    """Show what the agent did in each agent attempt of RUN_ID (prompts, replies, tools)."""
    # Here, not at the top: the viewer's glyph tables would cost every `run` command
    # (`run list` among them) 7 ms of imports.
    from ..view.text import transcript_line

    transcripts = cli_ctx.client().run_transcript(run_id, node_id)
    if as_json:
        emit_json(transcripts)
        return
    if not transcripts:
        where = f" of node {node_id!r}" if node_id else ""
        click.echo(f"{run_id}: no agent transcripts{where}")
    for transcript in transcripts:
        number = transcript["attemptNumber"] or "?"
        outcome = transcript["outcome"] or "unknown"
        click.echo(f"== {transcript['nodeId']} attempt {number} ({outcome}) ==")
        for entry in transcript["entries"]:
            click.echo(transcript_line(entry))


def _control_command(name: str, method: str, help_text: str) -> click.Command:
    @click.command(name, help=help_text)
    @click.argument("run_id")
    @json_option
    @pass_cli
    def command(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
        receipt = getattr(cli_ctx.client(), method)(run_id)
        if as_json:
            emit_json(receipt)
        else:
            detail = receipt.get("detail") or receipt.get("status") or "done"
            click.echo(f"{run_id}: {detail}")

    return command


run_group.add_command(
    _control_command("cancel", "cancel_run", "Cancel RUN_ID; a running worker is stopped.")
)
run_group.add_command(
    _control_command(
        "pause",
        "pause_run",
        "Pause RUN_ID: its worker stops now, and the node it was in runs again on resume.",
    )
)
run_group.add_command(_control_command("resume", "resume_run", "Resume a paused or parked RUN_ID."))


@run_group.command("restart")
@click.argument("run_id")
@click.option(
    "--message",
    "workflow_message_id",
    default=None,
    help="The terminal workflow message the restart is about (default: the latest).",
)
@click.option(
    "--expected-revision",
    type=click.IntRange(min=1),
    default=None,
    help="The revision of RUN_ID you decided on (default: the one `run status` reads now).",
)
@json_option
@pass_cli
def restart_command(
    cli_ctx: CliContext,
    run_id: str,
    workflow_message_id: str | None,
    expected_revision: int | None,
    as_json: bool,
) -> None:
    """Start RUN_ID's workflow again with the same input, as a restart of RUN_ID.

    Allowed for a finished, not cancelled, interactive run whose terminal message its
    session has shown and whose effects are all settled, at most three times per chain,
    and never into an outcome the chain has already had; repeating it prints the existing
    restart. A run that changed since EXPECTED_REVISION is refused.
    """
    client = cli_ctx.client()
    if expected_revision is None:
        expected_revision = client.known_run_status(run_id)["revision"]
    receipt = client.restart_run(run_id, expected_revision, workflow_message_id)
    if as_json:
        emit_json(receipt)
    else:
        click.echo(receipt["runId"])
