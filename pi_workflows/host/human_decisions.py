"""Checkpoints and human decisions on the host (SPEC §11).

Operations: ``checkpoint.answer`` and ``decision.answer`` (durable) and ``decision.list``
(query); channel effects in doubt are resolved through ``effects.confirm|retry``
(``host.effect_recovery``). The poll timer and startup apply decision deadlines with no worker
alive: the default response is recorded (provenance ``timeout``) and the continuation
run reserved in one transaction. Channels (``host.decision_channel_runner``) deliver and settle.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..clock import now_ms
from ..errors import AnswerNotAllowedError, InvalidInputError, NotFoundError, PiWorkflowsError
from ..home import config_dir
from ..limits import MAX_INPUT_BYTES, checked_json
from ..protocol.client_messages import ClientRequest
from ..protocol.framing import valid_id
from ..protocol.worker_messages import WorkerOperation
from ..records import DecisionResolution
from ..storage import (
    decision_presentation,
    decision_records,
    decision_resolutions,
    read_json,
)
from ..storage.decision_records import HumanDecision
from ..storage.runs import (
    current_revision,
    get_run,
    origin_session_id,
    refuse_answer_while_paused,
)
from .decision_channel_runner import ChannelRunner
from .features import feature_hook
from .receipts import OperationResult, outcome_for_error

if TYPE_CHECKING:
    from .operations import OperationTable
    from .services import HostServices

log = logging.getLogger("pi_workflows.host.human_decisions")

# `pi-workflows decision answer` without --channel answers as the local user.
DEFAULT_ANSWER_CHANNEL = "cli"


class HumanDecisions:
    """Checkpoint and decision operations, decision deadlines and the channel runner."""

    def __init__(self, services: HostServices) -> None:
        self.services = services
        self.channel_runner = ChannelRunner(services, self.answer_from_channel)

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_durable("checkpoint.answer", self.checkpoint_answer)
        operations.register_durable("decision.answer", self.decision_answer)
        operations.register_query("decision.list", self.decision_list)
        operations.register_query("channel.status", lambda request: self.channel_runner.status())

    @feature_hook
    def piwh_host_status(self) -> dict[str, Any]:
        return {"channels": self.channel_runner.status()}

    @feature_hook
    def piwh_audience_channels(self, audience: str) -> tuple[str, ...]:
        return self.channel_runner.config.channels_for(audience)

    # --- timers and listeners ----------------------------------------------------------

    @feature_hook
    def piwh_startup(self) -> None:
        # A host that was down at a deadline applies it before it serves anyone (on a
        # shared database, the duty host does).
        if self.services.is_duty_host:
            self.apply_deadlines()
        self.channel_runner.start(config_dir())

    @feature_hook
    def piwh_poll(self) -> None:
        if not self.services.is_duty_host:
            return  # another host of the shared database applies deadlines
        self.apply_deadlines()
        self.channel_runner.pump()

    @feature_hook
    def piwh_stopping(self) -> None:
        self.channel_runner.close()

    @feature_hook
    def piwh_worker_operation(
        self, operation: WorkerOperation, run_id: str, payload: dict[str, Any], result: Any
    ) -> None:
        if operation == WorkerOperation.CREATE_HUMAN_DECISION_REQUEST:
            # Its deliveries begin in the same commit; the channels are called after it.
            self.channel_runner.begin_deliveries(result["decisionId"], result["audience"])

    @feature_hook
    def piwh_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        # A cancelled run cancelled its open decisions; their channels settle now.
        if new_status == "cancelled" and decision_records.run_has_decisions(run_id):
            self.channel_runner.pump()

    def apply_deadlines(self) -> None:
        """Resolve every expired decision with its default, exactly once each."""
        if not (
            decision_resolutions.expired_decisions(now_ms())
            or decision_resolutions.has_pending_continuations()
        ):
            return  # an idle tick takes no write lock
        with self.services.store.transaction():
            continuations = decision_resolutions.reserve_pending_continuations()
            for decision in decision_resolutions.expired_decisions(now_ms()):
                if decision_resolutions.parent_is_parked(decision.run_id):
                    resolution = self._apply_default(decision)
                    if resolution.continuation_run_id:
                        continuations.append(resolution.continuation_run_id)
        if continuations:
            self.services.schedule_claim_pass()
            self.channel_runner.pump()

    def _apply_default(self, decision: HumanDecision) -> decision_resolutions.Resolution:
        resolution = decision_resolutions.resolve(
            decision,
            provenance=decision_records.PROVENANCE_TIMEOUT,
            response=read_json(decision.default_response_hash),
        )
        if resolution.won and not resolution.adopted:
            log.info("human decision %s resolved by its timeout default", decision.decision_id)
        return resolution

    # --- answers -----------------------------------------------------------------------

    def answer(
        self,
        decision_id: str,
        response: Any,
        channel: str,
        actor: str,
        decision: HumanDecision | None = None,
    ) -> OperationResult:
        """The one answer path of every channel (inside the caller's transaction);
        `decision` is its row when the caller has read it already."""
        if decision is None:
            decision = decision_records.get_decision(decision_id)
        config = self.channel_runner.config
        if channel not in config.channels_for(decision.audience):
            raise AnswerNotAllowedError(
                f"Channel {channel!r} may not answer decisions for audience {decision.audience!r}."
            )
        settings = config.channels.get(channel)
        if settings is None or not settings.allows(actor):
            raise AnswerNotAllowedError(
                f"Actor {actor!r} may not answer decisions through channel {channel!r}."
            )
        refuse_answer_while_paused(decision.run_id)
        record = decision_records.public_request(decision)
        response = decision_presentation.validate_response(
            record["choices"], _with_input_name(record["choices"], response), "The answer"
        )
        is_late = decision.deadline_at is not None and decision.deadline_at <= now_ms()
        if is_late and decision.status == "pending":
            # The deadline passed before this answer: the default wins, even if the
            # poll timer has not applied it yet.
            self._apply_default(decision)
        resolution = decision_resolutions.resolve(
            decision,
            provenance=decision_records.PROVENANCE_HUMAN,
            response=response,
            channel=channel,
            actor=actor,
        )
        self.services.claim_now()
        self.channel_runner.begin_settlements(decision)  # in this commit
        receipt = {
            "decisionId": decision_id,
            "parentRunId": decision.run_id,
            "status": decision_resolutions.decision_status(resolution.winner),
            "winner": resolution.winner,
            "continuationRunId": resolution.continuation_run_id,
        }
        if not resolution.won:
            return OperationResult(
                "conflict",
                receipt=receipt,
                error=f"Decision {decision_id} was already resolved by "
                f"{_who(resolution.winner)} at {resolution.winner['resolvedAt']}.",
                run_id=decision.run_id,
            )
        return OperationResult(
            "adopted" if resolution.adopted else "accepted",
            receipt=receipt,
            revision=current_revision(decision.run_id),
            run_id=decision.run_id,
        )

    def answer_from_channel(
        self, decision_id: str, response: Any, channel: str, actor: str
    ) -> dict[str, Any]:
        """`ChannelContext.report_answer`, on the loop: one transaction, a result dict."""
        try:
            with self.services.store.transaction():
                result = self.answer(decision_id, response, channel, actor)
        except PiWorkflowsError as error:
            return {"outcome": outcome_for_error(error), "error": str(error)}
        return {"outcome": result.outcome, "receipt": result.receipt, "error": result.error}

    def decision_answer(self, request: ClientRequest) -> OperationResult:
        """`decision.answer {decisionId, choice, input?, channel?, sessionId?}`."""
        payload = request.payload
        decision_id = payload.get("decisionId")
        if not valid_id(decision_id):
            raise NotFoundError("payload.decisionId must name a decision.")
        channel = payload.get("channel", DEFAULT_ANSWER_CHANNEL)
        decision = decision_records.get_decision(decision_id)
        actor = self._client_actor(decision, channel, payload.get("sessionId"))
        response: dict[str, Any] = {"choice": payload.get("choice")}
        if payload.get("input") is not None:
            response["input"] = payload["input"]
        return self.answer(decision_id, response, channel, actor, decision)

    def _client_actor(self, decision: HumanDecision, channel: Any, session_id: Any) -> str:
        """Who answers through `decision.answer`: the channel's kind decides (its
        `answer_actor`); a channel without one answers only through its own adapter."""
        adapter = self.channel_runner.channels.get(channel) if isinstance(channel, str) else None
        answer_actor = getattr(adapter, "answer_actor", None)
        if answer_actor is None:
            raise AnswerNotAllowedError(
                f"Channel {channel!r} answers through its own adapter, not decision.answer."
            )
        return answer_actor(
            {
                "decisionId": decision.decision_id,
                "runId": decision.run_id,
                "originSessionId": origin_session_id(decision.run_id),
                "sessionId": session_id,
            }
        )

    # --- checkpoints -------------------------------------------------------------------

    def checkpoint_answer(self, request: ClientRequest) -> OperationResult:
        """`checkpoint.answer {input}` for RUN: reserve its deterministic continuation."""
        run_id = request.target_run_id()
        parent = get_run(run_id)
        refuse_answer_while_paused(run_id)
        answer = request.payload.get("input")
        checked_json(answer, "The checkpoint answer", MAX_INPUT_BYTES)
        continuation_id = decision_records.continuation_id_for_checkpoint(run_id)
        receipt = {"parentRunId": run_id, "runId": continuation_id}
        if current_revision(continuation_id) is not None:
            # Adopts the same answer; another answer is a ConflictError.
            decision_resolutions.reserve_continuation(
                parent, continuation_id, input=answer, launch_options={}, actor="checkpoint"
            )
            return OperationResult(
                "adopted", receipt={**receipt, "alreadyAnswered": True}, run_id=run_id
            )
        state = decision_records.checkpoint_state(parent)
        if state is not None and decision_records.is_decision_node(run_id, state["waitingOn"]):
            return OperationResult(
                "rejected",
                error="Protected human decisions require a human channel; use "
                "'pi-workflows decision answer'.",
                run_id=run_id,
            )
        if state is None or not decision_resolutions.parent_is_parked(run_id):
            return OperationResult(
                "rejected",
                error=f"Workflow run {run_id} is not waiting at a checkpoint.",
                run_id=run_id,
            )
        decision_resolutions.reserve_continuation(
            parent,
            continuation_id,
            input=answer,
            launch_options={},
            actor=f"client:{request.client_id}",
        )
        self.services.claim_now()
        return OperationResult(
            "accepted",
            receipt={**receipt, "status": "queued"},
            revision=current_revision(run_id),
            run_id=run_id,
        )

    # --- listing -------------------------------------------------

    def decision_list(self, request: ClientRequest) -> list[dict[str, Any]]:
        include_resolved = request.payload.get("all", False)
        if not isinstance(include_resolved, bool):
            raise InvalidInputError("payload.all must be true or false.")
        return decision_records.list_decisions(include_resolved=include_resolved)


def _with_input_name(choices: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """A bare text input (`--input TEXT`) belongs to the chosen choice's text field."""
    given = response.get("input")
    spec = (choices.get(response.get("choice", "")) or {}).get("input")
    if isinstance(given, str) and spec is not None:
        return {**response, "input": {spec["name"]: given}}
    return response


def _who(winner: DecisionResolution) -> str:
    if winner["provenance"] == decision_records.PROVENANCE_TIMEOUT:
        return "its timeout default"
    if winner["provenance"] == decision_records.PROVENANCE_CANCELLATION:
        return "the cancellation of its run"
    return f"{winner['actor']} through channel {winner['channel']}"
