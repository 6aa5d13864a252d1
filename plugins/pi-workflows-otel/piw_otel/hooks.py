"""The hook implementations (the ``otel`` entry point): each hands its notification to
the process's `Telemetry`, built on the first notification.

Built lazily because every pi-workflows process loads its plugins (the command line
included) and most never announce anything; the one that does — the host, or a command
that changed a run with the host stopped — exports what it announced.
"""

from __future__ import annotations

import logging
import threading

from pi_workflows.plugin import Claim, NodeAttemptRecord, RunRecord, hookimpl

from . import settings
from .telemetry import Telemetry

log = logging.getLogger("piw_otel")

_lock = threading.Lock()
_built = False
_telemetry: Telemetry | None = None


def telemetry() -> Telemetry | None:
    """This process's telemetry, or None when the environment asks for no export."""
    global _built, _telemetry
    with _lock:
        if not _built:
            _built = True
            try:
                chosen = settings.from_environment()
            except settings.SettingsError as error:
                log.error("pi-workflows-otel exports nothing: %s", error)
                return None
            if not chosen.exports_nothing:
                _telemetry = Telemetry(chosen)
        return _telemetry


@hookimpl
def piw_run_transition(
    run_id: str,
    old_status: str | None,
    new_status: str,
    detail: str | None,
    workflow_name: str,
    at: int,
) -> None:
    if (exporting := telemetry()) is not None:
        exporting.run_transition(run_id, old_status, new_status, detail, workflow_name, at)


@hookimpl
def piw_run_claimed(run: RunRecord, claim: Claim) -> None:
    if (exporting := telemetry()) is not None:
        exporting.run_claimed(run)


@hookimpl
def piw_node_attempt_finished(attempt: NodeAttemptRecord) -> None:
    if (exporting := telemetry()) is not None:
        exporting.node_attempt_finished(attempt)
