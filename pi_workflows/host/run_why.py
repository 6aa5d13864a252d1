"""`run.why`: the one fact that holds a run now, and what ends it (SPEC §13).

Everything is read from the database, plus what only this host knows (its workers,
its blocked set, which sessions have a coordinator), so a host can explain runs that
another host owns. The answer is `{runId, status, reason, code, since, until, next}`:
`reason` is one sentence, `code` a stable word, `since`/`until` epoch milliseconds (or
null), `next` what ends the hold (a command to run, or what the host will do).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import plugins
from ..clock import now_ms
from ..event_types import EventType
from ..lineage import continued_as
from ..protocol.client_messages import ClientRequest
from ..storage import decision_records, effects, read_json, read_text, run_claims, run_holds
from ..storage.decision_records import HumanDecision
from ..storage.run_rows import Lease, Run, RunQueue, lease_row, queue_row
from ..storage.run_statuses import is_terminal_status
from ..storage.runs import continuation, get_run
from .features import feature_hook
from .operations import OperationTable
from .services import HostServices

NO_RETRY_CODES = run_claims.NEVER_AUTO_CLAIMED
# Holds that end only when someone acts: a follower (`run watch`) stops at them.
OPERATOR_HOLDS = ("paused", "effectAmbiguous", *NO_RETRY_CODES)


@dataclass(frozen=True)
class HostView:
    """What the answering host knows beyond the database."""

    host_id: str
    busy_workers: int
    max_workers: int
    is_active: Callable[[str], bool]  # a worker of this host runs the run now
    has_coordinator: Callable[[str], bool]  # a session has a live coordinator here
    audience_channels: Callable[[str], tuple[str, ...]]  # who may answer an audience
    # The claim plugins failing now, named (claiming goes on without them), or None.
    claim_failure: str | None = None
    # A claim plugin's remembered veto holds for the run at this revision.
    is_vetoed: Callable[[str, int], bool] = lambda _run_id, _revision: False
    # Plugins past their deadline in a launch, turn-report or presentation hook, each
    # named in a sentence (the built-in answers for them meanwhile).
    hung_plugins: tuple[str, ...] = ()


class RunWhy:
    """The `run.why` query, a host feature."""

    def __init__(self, services: HostServices) -> None:
        self.services = services

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_query("run.why", self.why)

    def why(self, request: ClientRequest) -> dict[str, Any]:
        return explain(request.target_run_id(), host_view(self.services))


def host_view(services: HostServices) -> HostView:
    busy, limit = services.worker_load()
    return HostView(
        host_id=services.host_id,
        busy_workers=busy,
        max_workers=limit,
        is_active=services.is_run_busy,
        has_coordinator=services.session_has_coordinator,
        claim_failure=services.claim_failure(),
        is_vetoed=services.is_vetoed,
        audience_channels=services.audience_channels,
        hung_plugins=tuple(sorted(plugins.hung_plugins().values())),
    )


def iso(ms: int | None) -> str:
    if ms is None:
        return "an unknown time"
    stamp = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def explain(run_id: str, host: HostView) -> dict[str, Any]:
    run = get_run(run_id)
    queue = queue_row(run_id)
    code, reason, since, until, next_step = _hold(run, queue, host)
    if not is_terminal_status(run.status):
        reason = "; ".join((reason, *(f"plugin hung: {hung}" for hung in host.hung_plugins)))
    return {
        "runId": run_id,
        "status": run.status,
        "reason": reason,
        "code": code,
        "since": since,
        "until": until,
        "next": next_step,
    }


Hold = tuple[str, str, int | None, int | None, str | None]


def _hold(run: Run, queue: RunQueue, host: HostView) -> Hold:
    run_id = run.run_id
    if is_terminal_status(run.status):
        return _terminal(run, queue)
    in_doubt = effects.ambiguous_effect_ids(run_id)
    if in_doubt:
        return (
            effects.AMBIGUOUS_CODE,
            f"waiting for effect {in_doubt[0]} to be confirmed or retried",
            queue.updated_at,
            None,
            effects.resolution_hint(in_doubt[0]),
        )
    if run.paused:
        actor, at = run_holds.latest_event(run_id, EventType.RUN_PAUSED) or ("someone", None)
        return (
            "paused",
            f"paused by {actor} at {iso(at)}",
            at,
            None,
            f"run 'pi-workflows run resume {run_id}'",
        )
    if queue.error_code in NO_RETRY_CODES:
        return _parked_for_good(run, queue)
    lease = lease_row(run_id)
    if lease.owner_id is not None:
        return _claimed(run, lease, host)
    if run.status == "waiting":
        return _waiting(run, queue, host)
    if queue.status == "parked":
        return (
            "parked",
            f"parked at its last durable boundary since {iso(queue.updated_at)}",
            queue.updated_at,
            None,
            "a host resumes it at its next claim pass",
        )
    return _queued(run, queue, host)


def _terminal(run: Run, queue: RunQueue) -> Hold:
    if run.status == "completed":
        return ("completed", f"completed at {iso(run.finished_at)}", run.finished_at, None, None)
    if run.status == "cancelled":
        return ("cancelled", f"cancelled at {iso(run.finished_at)}", run.finished_at, None, None)
    error = read_text(run.error_hash) or "no error was recorded"
    code = queue.error_code or run.status
    return (
        code,
        f"{run.status.replace('_', ' ')} at {iso(run.finished_at)}: {error}",
        run.finished_at,
        None,
        None,
    )


def _parked_for_good(run: Run, queue: RunQueue) -> Hold:
    detail = read_text(queue.error_hash) or queue.error_code
    if queue.error_code == "workflowSourceChanged":
        return (
            "workflowSourceChanged",
            f"workflow source changed: {detail}",
            queue.updated_at,
            None,
            f"restore the workflow file, then run 'pi-workflows run resume {run.run_id}'; "
            f"or 'pi-workflows run cancel {run.run_id}'",
        )
    return (
        queue.error_code or "parked",
        f"parked: {queue.error_code} since {iso(queue.updated_at)} ({detail})",
        queue.updated_at,
        None,
        f"run 'pi-workflows run resume {run.run_id}'",
    )


def _claimed(run: Run, lease: Lease, host: HostView) -> Hold:
    run_id = run.run_id
    epoch = run_holds.claim_epoch(lease)
    owner = f"host {lease.owner_id}" + (f" (epoch {epoch})" if epoch is not None else "")
    if not lease.is_live(now_ms()):
        return (
            "claimExpired",
            f"claimed by {owner} whose lease expired at {iso(lease.expires_at)}",
            lease.acquired_at,
            lease.expires_at,
            "the next claim pass of a live host takes it over",
        )
    if lease.owner_id == host.host_id and host.is_active(run_id):
        attempt = run_holds.running_attempt(run_id)
        if attempt is not None:
            return (
                "running",
                f"running node {attempt.node_id} (attempt {attempt.attempt_number}) since "
                f"{iso(attempt.started_at)} on {owner}",
                attempt.started_at,
                lease.expires_at,
                f"the node finishes; follow it with 'pi-workflows run watch {run_id}'",
            )
        return (
            "running",
            f"running on {owner} since {iso(lease.acquired_at)}",
            lease.acquired_at,
            lease.expires_at,
            f"follow it with 'pi-workflows run watch {run_id}'",
        )
    return (
        "claimed",
        f"claimed by {owner} whose lease expires at {iso(lease.expires_at)}",
        lease.acquired_at,
        lease.expires_at,
        "that host runs it; if it dies, another host takes the run over when the lease expires",
    )


def _waiting(run: Run, queue: RunQueue, host: HostView) -> Hold:
    run_id = run.run_id
    if queue.status == "done":
        carried = continuation(run_id)
        return (
            "continued",
            f"answered; {continued_as(carried)}" if carried else "answered",
            queue.updated_at,
            None,
            f"see 'pi-workflows run why {carried['latestRunId']}'" if carried else None,
        )
    decision = decision_records.pending_decision(run_id)
    if decision is not None:
        return _decision(decision, host.audience_channels(decision.audience))
    request = run_holds.pending_session_step(run_id)
    if request is not None:
        session = request.target_session_id
        presence = (
            "its coordinator is connected"
            if session is not None and host.has_coordinator(session)
            else "no coordinator is connected"
        )
        return (
            "session",
            f"waiting for session {session} to complete step {request.node_id} ({presence})",
            request.created_at,
            request.deadline_at,
            "the session's model submits the step"
            + (f"; it times out at {iso(request.deadline_at)}" if request.deadline_at else ""),
        )
    state = read_json(run.state_hash) or {}
    checkpoint = state.get("waitingOn")
    return (
        "checkpoint",
        f"waiting at checkpoint {checkpoint}",
        run.finished_at or queue.updated_at,
        None,
        f"run 'pi-workflows checkpoint answer {run_id} --input-json JSON'",
    )


def _decision(decision: HumanDecision, channels: tuple[str, ...]) -> Hold:
    reason = f"waiting for decision {decision.decision_id} ({decision.audience})"
    default = read_json(decision.default_response_hash) if decision.default_response_hash else None
    if decision.deadline_at is not None and default is not None:
        reason += (
            f" until {iso(decision.deadline_at)}; then the default "
            f"{json.dumps(default.get('choice'))}"
        )
    else:
        reason += " with no deadline"
    return (
        "decision",
        reason,
        decision.created_at,
        decision.deadline_at,
        "answer it " + " or ".join(_answer_paths(decision.decision_id, channels)),
    )


def _answer_paths(decision_id: str, channels: tuple[str, ...]) -> list[str]:
    """How a decision can be answered: only through the channels its audience allows."""
    paths = []
    for channel in channels:
        if channel == "cli":
            paths.append(f"with 'pi-workflows decision answer {decision_id} CHOICE'")
        elif channel == "session":
            paths.append("in its run's session ('/workflow answer' in Pi)")
        else:
            paths.append(f"through channel {channel}")
    return paths


def _queued(run: Run, queue: RunQueue, host: HostView) -> Hold:
    now = now_ms()
    if queue.available_at > now:
        return (
            "queued",
            f"queued; it may start at {iso(queue.available_at)}",
            queue.created_at,
            queue.available_at,
            "a host claims it after that",
        )
    ahead = run_holds.runs_queued_ahead(queue)
    reason = f"queued behind {ahead} runs; {host.busy_workers} of {host.max_workers} workers busy"
    if host.is_vetoed(run.run_id, run.revision):
        reason += "; a claim plugin (piw_may_claim) vetoes it"
    if host.claim_failure:
        reason += f"; {host.claim_failure}"
    return (
        "queued",
        reason,
        queue.created_at,
        None,
        "a host claims it when a worker is free",
    )
