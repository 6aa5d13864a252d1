"""`pi-workflows host run|start|stop|restart|status`."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from ..client.autostart import start_background_host
from ..client.connection import HostConnection
from ..errors import HostUnavailableError, HostVersionError
from ..host.hard_stop import stop_bound_s
from ..host.lock import live_lock_holder, read_lock
from ..host.process_identity import is_running, is_stopped
from .context import CliContext, emit_json, json_option, pass_cli, warn_if_settings_differ

# A host that does not answer a stop within this long is sent SIGTERM instead (its event
# loop may be blocked; SIGTERM is as clean a stop); one still there when a host must have
# exited (`stop_bound_s`, and a moment more) is reported by PID.
STOP_ASK_S = 2.0
STOP_SLACK_S = 5.0


@click.group("host")
def host_group() -> None:
    """Run, start, stop and inspect the workflow host of this home."""


@host_group.command("run")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Log to this file, rotated by size (default: stderr).",
)
@pass_cli
def run_command(cli_ctx: CliContext, log_file: Path | None) -> None:
    """Run the host in the foreground until Ctrl-C or SIGTERM."""
    from .. import settings
    from ..worker import zygote

    # The settings file's values reach this host's workers (and the agents they run) through
    # their environment, so every process of the host acts on the settings it started with.
    host_settings = settings.resolve()
    os.environ.update(host_settings.file_environment())
    # Forked before the host's own modules are imported: the fork server then never maps
    # them, and each worker it forks costs less (see `zygote`).
    standby = (
        zygote.fork_standby(str(cli_ctx.home.root)) if host_settings.switch("fork_server") else None
    )
    from ..host.runtime import run_host_forever

    run_host_forever(cli_ctx.home, cli_ctx.database_url, log_file, host_settings, standby)


def _start(cli_ctx: CliContext) -> bool:
    """Start a host unless one runs; whether one was already running."""
    try:
        connection = HostConnection(cli_ctx.home.socket_path)
    except HostUnavailableError:
        start_background_host(cli_ctx.home, cli_ctx.database_url)
        return False
    warn_if_settings_differ(connection.hello)
    connection.close()
    return True


def _stop(cli_ctx: CliContext) -> bool:
    """Stop the running host and wait until it is gone; whether one was running.

    A host that holds the home's lock is never reported absent: one that does not answer
    (its event loop blocked, or another version) is sent SIGTERM, and one that outlives
    the bound of a stop is named by PID.
    """
    holder = live_lock_holder(cli_ctx.home.lock_path)
    cli_ctx.drop_client()  # this talks to the host on a short-lived connection of its own
    if holder is not None and is_stopped(holder["pid"], holder["startIdentity"]):
        _refuse_stopped(holder["pid"])
    try:
        connection = HostConnection(cli_ctx.home.socket_path, timeout_s=STOP_ASK_S)
        try:
            connection.request("host.stop")
        finally:
            connection.close()
    except (HostUnavailableError, HostVersionError):
        if holder is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder["pid"], signal.SIGTERM)
    wait_s = stop_bound_s() + STOP_SLACK_S
    deadline = time.monotonic() + wait_s
    while holder is not None and is_running(holder["pid"], holder["startIdentity"]):
        if is_stopped(holder["pid"], holder["startIdentity"]):
            _refuse_stopped(holder["pid"])
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"The host (PID {holder['pid']}) holds the home's lock and did not stop within "
                f"{wait_s:.0f} s of being asked and signalled; see its log, then end it with "
                f"'kill -9 {holder['pid']}'."
            )
        time.sleep(0.05)
    return True


def _refuse_stopped(pid: int) -> NoReturn:
    """A stopped host acts on nothing until it runs again: say so at once, not after the
    bound of a stop. The SIGTERM it is sent ends it then."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    raise click.ClickException(
        f"The host (PID {pid}) holds the home's lock but is stopped (SIGSTOP, or Ctrl-Z in "
        f"its terminal), so it cannot stop; it was sent SIGTERM and stops once it runs "
        f"again: run 'kill -CONT {pid}'."
    )


def _started_result(already: bool, cli_ctx: CliContext, as_json: bool, verb: str) -> None:
    holder = live_lock_holder(cli_ctx.home.lock_path)
    result = {"running": True, "alreadyRunning": already, "pid": holder["pid"] if holder else None}
    if as_json:
        emit_json(result)
    elif already:
        click.echo(f"host already running (PID {result['pid']})")
    else:
        click.echo(f"host {verb} (PID {result['pid']})")


@host_group.command("start")
@json_option
@pass_cli
def start_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Start the host in the background and wait until it is ready (idempotent)."""
    _started_result(_start(cli_ctx), cli_ctx, as_json, "started")


@host_group.command("stop")
@json_option
@pass_cli
def stop_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Stop the running host cleanly; runs in flight are parked and resume later."""
    stopped = _stop(cli_ctx)
    if as_json:
        emit_json({"stopped": stopped, "running": False})
    else:
        click.echo("host stopped" if stopped else "no host is running")


@host_group.command("restart")
@json_option
@pass_cli
def restart_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Stop the running host and start one with this command's settings (the settings file,
    overridden by this shell's PI_WORKFLOWS_* variables); runs in flight resume."""
    from ..settings import resolve

    resolve()  # refuse bad settings before stopping the host that works
    _stop(cli_ctx)
    _start(cli_ctx)
    _started_result(False, cli_ctx, as_json, "restarted")


@host_group.command("status")
@json_option
@pass_cli
def status_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Show host state, epoch, uptime, workers, clients and run counts."""
    try:
        status = cli_ctx.client(autostart=False).host_status()
    except HostUnavailableError:
        status = {"state": "stopped"}
    if as_json:
        emit_json(status)
        return
    if status["state"] == "stopped":
        click.echo("host: stopped")
        return
    # The host that just answered holds the lock: its record needs no liveness check.
    holder = read_lock(cli_ctx.home.lock_path)
    pid = holder["pid"] if holder else "unknown"
    click.echo(f"host: {status['state']} (PID {pid}, epoch {status['epoch']})")
    click.echo(f"uptime: {status['uptimeMs'] / 1000:.1f} s")
    click.echo(f"workers: {status['activeWorkers']} of {status['maxWorkers']}")
    click.echo(f"clients: {status['connectedClients']}")
    held = ", ".join(f"{n} {purpose}" for purpose, n in status["databaseConnections"].items())
    click.echo(f"database connections: {held or 'none'}")
    if status.get("databaseUnavailable"):
        click.echo(f"DATABASE UNAVAILABLE: {status['databaseUnavailable']}")
        click.echo(f"database: {status['database']}")
        click.echo(f"log: {status['logFile'] or 'stderr (not a file)'}")
        return
    others = [h for h in status["hosts"] if not h["self"]]
    if others:
        listed = ", ".join(f"{h['machine']} PID {h['pid']} epoch {h['epoch']}" for h in others)
        click.echo(f"other hosts on this database: {listed}")
    click.echo(
        f"runs: {status['queuedRuns']} queued, {status['runningRuns']} running, "
        f"{status['parkedRuns']} parked, {status['waitingRuns']} waiting"
    )
    if status["claimPassFailure"]:
        click.echo(f"claim pass failing: {status['claimPassFailure']}")
    for sentence in status.get("hungPlugins", []):
        click.echo(f"plugin hung: {sentence}")
    click.echo(f"database: {status['database']}")
    click.echo(f"log: {status['logFile'] or 'stderr (not a file)'}")
    executor = status["agentExecutor"]
    missing = "" if executor["registered"] else " (NOT REGISTERED: no plugin provides it)"
    click.echo(f"agent executor: {executor['name']}{missing}")
    click.echo(f"plugins: {', '.join(plugin['name'] for plugin in status['plugins'])}")
    _echo_channels(status["channels"])
    _echo_last_prune(status.get("lastPrune"))
    click.echo("settings (pi-workflows config set KEY VALUE; environment overrides):")
    for item in status["settings"]:
        shown = "(not set)" if item["value"] is None else item["value"]
        click.echo(f"  {item['key']} = {shown}  [{item['source']}]")
    click.echo(
        f"attention: {status['expiredClaims']} expired claims, {status['pendingInteractions']} "
        f"pending interactions, {status['ambiguousEffects']} ambiguous effects, "
        f"{status['lifecycleContradictions']} lifecycle contradictions"
    )


def _echo_last_prune(last: dict[str, Any] | None) -> None:
    if last is None:
        click.echo("last prune: none yet")
    elif last["outcome"] == "failed":
        click.echo(f"last prune: failed at {_when(last['at'])}: {last['error']}")
    else:
        click.echo(
            f"last prune: completed at {_when(last['at'])}: {last['runs']} runs, "
            f"{last['blobs']} blobs, {last['bytes']} bytes"
        )


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _echo_channels(channels: dict[str, Any]) -> None:
    """Decision channel health: a bad configuration or a channel that is not running is
    shown here, not only in the host log."""
    if not channels["configured"]:
        click.echo(f"decision channels NOT CONFIGURED (built-ins only): {channels['error']}")
    states = ", ".join(f"{c['channel']} {c['state']}" for c in channels["channels"])
    click.echo(f"decision channels: {states}")
    for channel in channels["channels"]:
        if channel["error"]:
            click.echo(f"  {channel['channel']}: {channel['error']}")
    if channels["ambiguous"] or channels["gaveUp"]:
        click.echo(
            f"  {len(channels['ambiguous'])} channel effects in doubt, "
            f"{len(channels['gaveUp'])} deliveries gave up: pi-workflows effects list"
        )
