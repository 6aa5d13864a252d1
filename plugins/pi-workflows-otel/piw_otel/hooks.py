"""The hook implementations (the ``otel`` entry point): each hands its notification to
the process's `Telemetry`.

Every pi-workflows process loads its plugins (each command-line call included) and most
never announce anything, so nothing of OpenTelemetry is imported until a process
announces something with an export configured. Importing the SDK and building its
exporters takes a second or more on a loaded machine, longer than a notification may take
(the hook deadline), so that happens on a thread of its own: notifications that come
meanwhile wait for it, in order, and are handed over when it is done. The thread is not a
daemon, so a command that exits right after announcing still exports what it announced.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pi_workflows.plugin import Claim, NodeAttemptRecord, RunRecord, hookimpl

from . import settings

if TYPE_CHECKING:
    from .telemetry import Telemetry

# Notifications held while the SDK is set up; past it the newest are dropped.
MAX_PENDING = 10_000

log = logging.getLogger("piw_otel")

Action = Callable[["Telemetry"], None]

_lock = threading.Lock()
_state = "unset"  # unset | building | ready | off
_telemetry: Telemetry | None = None
_pending: list[Action] = []


def use(telemetry: Telemetry | None) -> None:
    """Hand this process's notifications to `telemetry` from now on, instead of the one the
    ``OTEL_*`` variables describe: an application that embeds a host with exporters of its
    own, or a test with the SDK's in-memory exporter and reader. ``None`` goes back to the
    variables, read at the next notification. Call it before the host starts."""
    global _state, _telemetry, _pending
    with _lock:
        _telemetry, _pending = telemetry, []
        _state = "unset" if telemetry is None else "ready"


def _deliver(action: Action) -> None:
    """Run `action` on this process's telemetry, once it is built (in order)."""
    global _state
    with _lock:
        if _state == "unset":
            _state = _first_state()
            if _state == "building":
                threading.Thread(target=_build, name="piw-otel-setup").start()
        if _state == "off":
            return
        if _state == "building":
            if len(_pending) < MAX_PENDING:
                _pending.append(action)
            return
        telemetry = _telemetry
    assert telemetry is not None
    action(telemetry)


def _first_state() -> str:
    try:
        chosen = settings.from_environment()
    except settings.SettingsError as error:
        log.error("pi-workflows-otel exports nothing: %s", error)
        return "off"
    return "off" if chosen.exports_nothing else "building"


def _build() -> None:
    global _state, _telemetry, _pending
    try:
        from .telemetry import Telemetry

        built = Telemetry.from_settings(settings.from_environment())
    except Exception as error:  # the host runs on without telemetry
        log.error("pi-workflows-otel exports nothing: %s: %s", type(error).__name__, error)
        with _lock:
            _state, _pending = "off", []
        return
    while True:  # hand over what came meanwhile, and what comes while handing it over
        with _lock:
            waiting, _pending = _pending, []
            if not waiting:
                _telemetry, _state = built, "ready"
                return
        for action in waiting:
            _run(action, built)


def _run(action: Action, telemetry: Telemetry) -> None:
    try:
        action(telemetry)
    except Exception as error:
        log.warning("pi-workflows-otel dropped a notification: %s: %s", type(error).__name__, error)


@hookimpl
def piw_run_transition(
    run_id: str,
    old_status: str | None,
    new_status: str,
    detail: str | None,
    workflow_name: str,
    at: int,
) -> None:
    _deliver(
        lambda telemetry: telemetry.run_transition(
            run_id, old_status, new_status, detail, workflow_name, at
        )
    )


@hookimpl
def piw_run_claimed(run: RunRecord, claim: Claim) -> None:
    _deliver(lambda telemetry: telemetry.run_claimed(run))


@hookimpl
def piw_node_attempt_finished(attempt: NodeAttemptRecord) -> None:
    _deliver(lambda telemetry: telemetry.node_attempt_finished(attempt))


@hookimpl
def piw_worker_exited(
    run_id: str, outcome: str, exit_code: int | None, signal: int | None, at: int
) -> None:
    _deliver(lambda telemetry: telemetry.worker_exited(run_id, outcome, signal))
