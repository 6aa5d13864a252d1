"""The engine: executes a workflow definition against a run backend (engine.md §3).

The engine thread owns the backend. Each node attempt runs its callbacks in a helper
thread; backend calls the callbacks make (notifications, effects, updates) are handed to
the engine thread through one inbox, which also carries the attempt's completion and
cancel/park requests. So the backend sees one caller at a time — exactly what the
worker's request/response protocol needs — and a deadline is just an inbox timeout.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..authoring import Workflow, validate_graph
from ..canonical import is_json_value
from ..clock import now_ms
from ..errors import (
    ClaimLostError,
    InvalidInputError,
    RevisionConflictError,
    WorkflowDefinitionError,
    WorkflowSourceChangedError,
)
from ..event_types import RUN_ENDS, EventType
from .agents import (
    AgentExecutor,
    headless_executor,
)
from .attempt import Attempt, AwaitInteraction, EffectAmbiguous, as_json, describe
from .context import NodeAborted, NodeContext, NodeTimedOut, PresentationContext
from .node_kinds import Publish, checked_agent_output, rejection, run_node
from .node_thread import NodeThread
from .processes import registering_with
from .routing import RoutingError, failure_route, next_node
from .run_backend import RunBackend
from .updates import TokenBucket, check_update

RUN_STATE_SCHEMA = "pi-workflows.run-state.v1"
TRACE_EVENT_SCHEMA = "pi-workflows.trace-event.v1"
TERMINAL_STATUSES = ("completed", "failed", "timed_out", "cancelled")
PRESENTATION_TIMEOUT_SECONDS = 30.0
# After an attempt ends, its thread gets this long to stop (a shell kills its group).
ABANDON_GRACE_SECONDS = 2.0
# How often the engine thread looks for transcript entries to save while an agent runs.
TRANSCRIPT_POLL_SECONDS = 0.25
CURRENT_FIELDS = (
    "currentNode",
    "currentNodeType",
    "currentAttemptId",
    "currentNodeStartedAt",
    "statusDetail",
)
FATAL_STORE_ERRORS = (ClaimLostError, RevisionConflictError)


class _Parked(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _Cancelled(Exception):
    pass


class _RunFailed(Exception):
    def __init__(self, error: str, status: str = "failed") -> None:
        super().__init__(error)
        self.error = error
        self.status = status


class _CheckpointReached(Exception):
    def __init__(self, node_id: str, output: Any) -> None:
        super().__init__(node_id)
        self.node_id = node_id
        self.output = output


class _InteractionPending(Exception):
    """The run waits for its origin session to answer an agent step."""


@dataclass
class _BackendCall:
    attempt: Attempt
    method: str
    payload: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass
class _Done:
    attempt: Attempt
    output: Any = None
    error: BaseException | None = None


class _Stop:
    """Wakes the engine thread after cancel() or park()."""


class Engine:
    """Executes one run. `cancel()` and `park()` may be called from any thread."""

    def __init__(
        self,
        definition: Workflow,
        backend: RunBackend,
        *,
        agent_executor: AgentExecutor | None = None,
    ) -> None:
        self.definition = definition
        self.backend = backend
        self.run_id = backend.run_id
        self.state: dict[str, Any] = {}
        self._agent_executor = agent_executor
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._stop: str | None = None
        self._updates = TokenBucket()
        self._run_info: dict[str, Any] = {}
        self._idle_thread: NodeThread | None = None  # the last attempt's, free again

    # --- what node handlers use of the run (node_kinds.StepRun) ---------------------------

    @property
    def workflow_name(self) -> str:
        return self.definition.name

    @property
    def is_interactive(self) -> bool:
        return self._run_info.get("executionMode") == "interactive"

    @property
    def agent_executor(self) -> AgentExecutor:
        return self._agent_executor or headless_executor()

    # --- control -----------------------------------------------------------------------

    def cancel(self) -> None:
        """End the run `cancelled` at once; the active attempt is recorded cancelled."""
        self._request_stop("cancel")

    def park(self) -> None:
        """Stop without writing; the active attempt is dropped and reruns on resume."""
        self._request_stop("park")

    def _request_stop(self, kind: str) -> None:
        if self._stop is None:
            self._stop = kind
        self._inbox.put(_Stop())

    # --- entry points (SPEC §7.3 commands) ---------------------------------------------

    def execute(self, command: dict[str, Any]) -> dict[str, Any]:
        """Run a worker command `{kind: start|resume|restart|continue, ...}`."""
        kind = command.get("kind")
        if kind == "start":
            return self.start(command.get("input"))
        if kind == "restart":
            return self.start(command.get("input"), restart=True)
        if kind == "resume":
            return self.resume(command.get("resumeInteractionAttemptId"))
        if kind == "continue":
            return self.continue_from(
                command["parentRunId"], command.get("input"), command.get("humanDecision")
            )
        raise InvalidInputError(f"Unknown worker command kind {kind!r}.")

    def start(self, input: Any, *, restart: bool = False) -> dict[str, Any]:
        """Start from `start_at` with fresh state (`restart` records where it came from)."""
        info = self._load()
        self.state = self._fresh_state(input)
        try:
            validate_graph(self.definition)
            normalized = self._normalize_input(input)
        except (_RunFailed, WorkflowDefinitionError) as error:
            message = str(error)
            return self._drive(lambda: self._finish("failed", error=message))
        self.state["input"] = normalized
        payload: dict[str, Any] = {"workflowName": self.definition.name, "input": normalized}
        if restart and info.get("parentRunId"):
            payload["restartOf"] = info["parentRunId"]

        def body() -> None:
            self._persist(EventType.RUN_STARTED, "run", payload)
            self._run_from(self.definition.start_at, None)

        return self._drive(body)

    def resume(self, timed_out_attempt_id: str | None = None) -> dict[str, Any]:
        """Continue from the last durable boundary; an interrupted attempt runs again.

        A waiting agent attempt is finished with its accepted (or still validating)
        submission, or recorded `timed_out` when the host expired its interaction
        deadline and names it in `timed_out_attempt_id`.
        """
        info = self._load()
        state = info["state"]
        if state is None:
            return self.start(info["input"])
        validate_graph(self.definition)
        self.state = state
        status = state["status"]
        if status in TERMINAL_STATUSES:
            return self._outcome()
        if status == "waiting":
            current = state.get("currentAttemptId")
            accepted = info.get("acceptedInteraction")
            if accepted and accepted["attemptId"] == current:
                return self._drive(lambda: self._complete_interaction(accepted))
            candidate = info.get("candidateInteraction")
            if candidate and candidate["attemptId"] == current:
                return self._drive(lambda: self._complete_interaction(candidate, candidate=True))
            if timed_out_attempt_id is not None and timed_out_attempt_id == current:
                return self._drive(self._time_out_interaction)
            return self._outcome()
        unrecorded = info.get("pendingInteraction")
        if unrecorded and unrecorded["attemptId"] == state.get("currentAttemptId"):
            # The attempt asked its session, then its worker or host died before the wait
            # was recorded: record it now, on the same request, instead of asking again.
            attempt = self._waiting_attempt()
            attempt.prompt = unrecorded["prompt"]
            return self._drive(lambda: self._wait_for_interaction(attempt, unrecorded["requestId"]))
        return self._drive(self._resume_running)

    def continue_from(
        self, parent_run_id: str, input: Any, human_decision: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Continue a waiting parent run: the answer becomes its checkpoint's output.

        `human_decision` is ``{"decisionId": ..., "response": {"choice": ..., "input"?}}``;
        without it the run input is the answer.
        """
        self._load()
        validate_graph(self.definition)
        parent_info = self.backend.read_run_state(parent_run_id)
        parent = parent_info["state"] or {}
        checkpoint_id = parent.get("waitingOn")
        if (
            parent.get("status") != "waiting"
            or checkpoint_id is None
            or checkpoint_id not in self.definition.nodes
        ):
            raise InvalidInputError(
                f"Workflow run {parent_run_id} is not waiting at a checkpoint, so it cannot "
                "be continued."
            )
        if human_decision is not None:
            _check_recorded_answer(human_decision, parent_info.get("decisionAnswer"))
        answer = self._checkpoint_answer(parent, checkpoint_id, input, human_decision)
        self.state = self._fresh_state(input)
        for key in ("outputs", "results"):
            self.state[key] = copy.deepcopy(parent.get(key, {}))
        self.state["steps"] = copy.deepcopy(parent.get("steps", []))
        self.state["carriedStepCount"] = len(self.state["steps"])
        self.state["outputs"][checkpoint_id] = answer
        result = self.state["results"][checkpoint_id]
        result["output"] = answer
        for step in reversed(self.state["steps"]):
            if step["attemptId"] == result["attemptId"]:
                step["output"] = answer
                break
        if human_decision is not None:
            self.state["humanDecision"] = {
                "decisionId": human_decision.get("decisionId"),
                "choice": answer["choice"],
            }

        def body() -> None:
            self._persist(
                EventType.RUN_STARTED,
                "run",
                {
                    "workflowName": self.definition.name,
                    "input": self.state["input"],
                    "continuedFrom": parent_run_id,
                    "checkpoint": checkpoint_id,
                    "carriedSteps": self.state["carriedStepCount"],
                },
            )
            self._run_from(None, answer, after=(checkpoint_id, result), stop_at_checkpoint=False)

        return self._drive(body)

    # --- run level -----------------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        info = self.backend.read_run_state()
        expected = info.get("definitionDigest")
        if expected and expected != self.definition.definition_digest:
            raise WorkflowSourceChangedError(
                f"Workflow {self.definition.name!r} changed since run {self.run_id} was "
                "created (definition digest differs); restore it, or cancel the run."
            )
        self._run_info = info
        return info

    def _fresh_state(self, input: Any) -> dict[str, Any]:
        stamp = now_ms()
        return {
            "schema": RUN_STATE_SCHEMA,
            "traceSeq": 0,
            "runId": self.run_id,
            "workflowName": self.definition.name,
            "workflowSource": self._run_info.get("workflowSource"),
            "definitionDigest": self.definition.definition_digest,
            "parentRunId": self._run_info.get("parentRunId"),
            "startedAt": stamp,
            "updatedAt": stamp,
            "status": "running",
            "input": input if is_json_value(input) else None,
            "outputs": {},
            "results": {},
            "steps": [],
        }

    def _normalize_input(self, raw: Any) -> Any:
        value = raw
        if self.definition.input is not None:
            try:
                value = self.definition.input(raw)
            except Exception as error:
                raise _RunFailed(
                    f"Workflow {self.definition.name!r} rejected its input: {describe(error)}"
                ) from error
        try:
            return as_json(value, "The normalised workflow input")
        except InvalidInputError as error:
            raise _RunFailed(str(error)) from error

    def _checkpoint_answer(
        self,
        parent: dict[str, Any],
        checkpoint_id: str,
        input: Any,
        human_decision: dict[str, Any] | None,
    ) -> Any:
        node = self.definition.nodes[checkpoint_id]
        if human_decision is None:
            if node.human_decision is not None:
                raise InvalidInputError(
                    f"Checkpoint {checkpoint_id!r} is a human decision; only a decision "
                    "answer can continue it."
                )
            return as_json(input, "The checkpoint answer")
        spec = node.human_decision
        response = human_decision.get("response")
        if spec is None or not isinstance(response, dict):
            raise InvalidInputError(
                f"Checkpoint {checkpoint_id!r} cannot take a human decision response."
            )
        if response.get("choice") not in spec.choices:
            raise InvalidInputError(
                f"Human decision {checkpoint_id!r} has no choice {response.get('choice')!r}."
            )
        requested = parent.get("outputs", {}).get(checkpoint_id) or {}
        if human_decision.get("decisionId") not in (None, requested.get("decisionId")):
            raise InvalidInputError(
                f"Decision {human_decision.get('decisionId')} does not belong to checkpoint "
                f"{checkpoint_id!r} of run {parent.get('runId')}."
            )
        return as_json(response, "The human decision response")

    def _resume_running(self) -> None:
        state = self.state
        steps = state["steps"]
        payload: dict[str, Any] = {"replayedSteps": len(steps)}
        interrupted = state.get("currentNode")
        if interrupted is not None:
            payload["resumedAttemptId"] = state.get("currentAttemptId")
            for key in CURRENT_FIELDS:
                state.pop(key, None)
        payload["resumeAt"] = interrupted or (None if steps else self.definition.start_at)
        self._persist(EventType.RUN_RELAUNCHED, "run", payload)
        if interrupted is not None:
            self._run_from(interrupted, self._last_output())
        elif not steps:
            self._run_from(self.definition.start_at, None)
        else:
            last = state["results"][steps[-1]["nodeId"]]
            # A continuation's last carried step is the checkpoint its parent answered.
            answered = len(steps) <= state.get("carriedStepCount", 0)
            self._run_from(
                None,
                self._last_output(),
                after=(steps[-1]["nodeId"], last),
                stop_at_checkpoint=not answered,
            )

    def _last_output(self) -> Any:
        for step in reversed(self.state["steps"]):
            if step["outcome"] == "ok":
                return step["output"]
        return None

    def _complete_interaction(self, submitted: dict[str, Any], *, candidate: bool = False) -> None:
        """Record the waiting agent attempt with its submission, then go on.

        A `candidate` submission is still validating: the node's validator decides. A
        refusal goes back to the host (the request stays pending and the run keeps
        waiting, so the session can correct its output); an acceptance settles the
        request before the attempt is recorded.
        """
        state = self.state
        attempt = self._waiting_attempt()
        node_id, node = attempt.node_id, attempt.node
        failure: str | None = None
        failure_class: str | None = None
        output: Any = None
        refusal: str | None = None
        try:
            output = checked_agent_output(node, submitted["output"], self._context(attempt))
        except Exception as error:
            failure, refusal = describe(error), rejection(error)
            failure_class = type(error).__name__
        if candidate:
            coordinates = {
                "requestId": submitted["requestId"],
                "submissionId": submitted["submissionId"],
                "attemptId": attempt.attempt_id,
            }
            if refusal is not None:
                self.backend.reject_interaction({**coordinates, "error": refusal})
                return
            self.backend.accept_interaction(coordinates)
        state["status"] = "running"
        state.pop("waitingOn", None)
        if failure is None:
            result = self._record(attempt, "ok", output=output)
        else:
            result = self._record(attempt, "failed", error=failure, error_class=failure_class)
        self._run_from(None, self._last_output(), after=(node_id, result))

    def _waiting_attempt(self) -> Attempt:
        state = self.state
        node_id = state["currentNode"]
        node = self.definition.nodes[node_id]
        return Attempt(node_id, state["currentAttemptId"], node, state["currentNodeStartedAt"])

    def _time_out_interaction(self) -> None:
        """The session's model turns used up the step's time: the attempt timed out."""
        attempt = self._waiting_attempt()
        self.state["status"] = "running"
        self.state.pop("waitingOn", None)
        error = f"Node {attempt.node_id!r} timed out after {attempt.node.timeout_ms} ms"
        result = self._record(attempt, "timed_out", error=error)
        self._run_from(None, self._last_output(), after=(attempt.node_id, result))

    def _drive(self, body: Any) -> dict[str, Any]:
        self._start_agent_early()
        try:
            body()
        except _Parked as parked:
            return {
                "runId": self.run_id,
                "status": "parked",
                "reason": parked.reason,
                "detail": parked.detail,
            }
        except _InteractionPending:
            pass
        return self._outcome()

    def _start_agent_early(self) -> None:
        """Let the agent executor of a headless run with agent steps start its agent now,
        so the first step does not wait for it (the optional ``prepare()``)."""
        if self.is_interactive:
            return
        if not any(node.node_type == "agent" for node in self.definition.nodes.values()):
            return
        try:
            prepare = getattr(self.agent_executor, "prepare", None)
            if prepare is not None:
                with registering_with(_RunProcesses(self.backend)):
                    prepare()
        except FATAL_STORE_ERRORS:
            raise
        except Exception:  # the first agent step reports what is wrong
            pass

    def _outcome(self) -> dict[str, Any]:
        outcome = {"runId": self.run_id, "status": self.state["status"]}
        for key in ("finalOutput", "error", "waitingOn"):
            if key in self.state:
                outcome[key] = self.state[key]
        return outcome

    def _run_from(
        self,
        current: str | None,
        last_output: Any,
        *,
        after: tuple[str, dict[str, Any]] | None = None,
        stop_at_checkpoint: bool = True,
    ) -> None:
        try:
            if after is not None:
                node_id, result = after
                if result["outcome"] == "ok":
                    last_output = result["output"]
                current = self._route(node_id, result, stop_at_checkpoint=stop_at_checkpoint)
            while current is not None:
                if self._stop == "park":
                    raise _Parked("parked", "The workflow run was parked.")
                if self._stop == "cancel":
                    raise _Cancelled()
                if len(self.state["steps"]) >= self.definition.max_steps:
                    raise _RunFailed(
                        f"Workflow {self.definition.name!r} exceeded max_steps "
                        f"({self.definition.max_steps}) before node {current!r}"
                    )
                result = self._attempt(current)
                if result["outcome"] == "ok":
                    last_output = result["output"]
                current = self._route(current, result)
            self._finish("completed", final_output=last_output)
        except _CheckpointReached as reached:
            self._finish("waiting", final_output=reached.output, waiting_on=reached.node_id)
        except _Cancelled:
            self._finish("cancelled", error="The workflow run was cancelled.")
        except _RunFailed as failure:
            self._finish(failure.status, error=failure.error)

    def _route(
        self, node_id: str, result: dict[str, Any], *, stop_at_checkpoint: bool = True
    ) -> str | None:
        outcome = result["outcome"]
        try:
            if outcome == "cancelled":
                raise _Cancelled()
            if outcome != "ok":
                target = failure_route(self.definition, node_id, result)
                if target is None:
                    verb = "timed out" if outcome == "timed_out" else "failed"
                    raise _RunFailed(
                        f"Node {node_id!r} {verb}: {result.get('error')}",
                        status="timed_out" if outcome == "timed_out" else "failed",
                    )
                return target
            if stop_at_checkpoint and self.definition.nodes[node_id].node_type == "checkpoint":
                raise _CheckpointReached(node_id, result["output"])
            return next_node(self.definition, node_id, result)
        except RoutingError as error:
            raise _RunFailed(str(error)) from error

    def _finish(
        self,
        status: str,
        *,
        final_output: Any = None,
        error: str | None = None,
        waiting_on: str | None = None,
    ) -> None:
        state = self.state
        for key in CURRENT_FIELDS:
            state.pop(key, None)
        payload: dict[str, Any] = {"status": status}
        if status in ("completed", "waiting"):
            state["finalOutput"] = payload["finalOutput"] = final_output
            prompt = self._presentation_prompt(final_output)
            if prompt:
                self.backend.request_presentation({"prompt": prompt})
            payload["presentationRequired"] = bool(prompt)
        if error is not None:
            state["error"] = payload["error"] = error
        if waiting_on is not None:
            state["waitingOn"] = payload["waitingOn"] = waiting_on
        else:
            state["finishedAt"] = now_ms()
        state["status"] = status
        self._persist(RUN_ENDS[status], "run", payload)

    def _presentation_prompt(self, final_output: Any) -> str | None:
        prompt = self.definition.presentation_prompt
        if prompt is None or isinstance(prompt, str):
            return prompt.strip() or None if prompt else None
        # The builder is user code: the finished node's result must not wait on it.
        self.backend.flush()
        answer: list[Any] = []
        context = PresentationContext(copy.deepcopy(self.state), copy.deepcopy(final_output))
        worker = threading.Thread(
            target=lambda: answer.append(_call_quietly(prompt, context)), daemon=True
        )
        worker.start()
        # A slow or failing builder costs the run its presentation, never its result.
        worker.join(PRESENTATION_TIMEOUT_SECONDS)
        text = answer[0] if answer else None
        return text.strip() or None if isinstance(text, str) else None

    def _persist(
        self,
        event_type: EventType,
        scope: str,
        payload: dict[str, Any],
        node_id: str | None = None,
        attempt_id: str | None = None,
    ) -> None:
        state = self.state
        stamp = now_ms()
        state["traceSeq"] += 1
        state["updatedAt"] = stamp
        event: dict[str, Any] = {
            "schema": TRACE_EVENT_SCHEMA,
            "seq": state["traceSeq"],
            "at": stamp,
            "scope": scope,
            "type": event_type,
            "runId": self.run_id,
            "payload": payload,
        }
        if node_id is not None:
            event["nodeId"] = node_id
        if attempt_id is not None:
            event["attemptId"] = attempt_id
        self.backend.write_snapshot(state, event)

    # --- one attempt ---------------------------------------------------------------------

    def _attempt(self, node_id: str) -> dict[str, Any]:
        node = self.definition.nodes[node_id]
        attempt = Attempt(node_id, uuid.uuid4().hex, node, now_ms())
        self.state.update(
            currentNode=node_id,
            currentNodeType=node.node_type,
            currentAttemptId=attempt.attempt_id,
            currentNodeStartedAt=attempt.started_at,
        )
        started: dict[str, Any] = {"nodeType": node.node_type}
        if node.status_detail is not None:
            self.state["statusDetail"] = started["statusDetail"] = node.status_detail
        self._persist(EventType.NODE_STARTED, "node", started, node_id, attempt.attempt_id)
        if self._stop == "park":
            raise _Parked("parked", "The workflow run was parked.")
        if self._stop == "cancel":
            return self._record(attempt, "cancelled", error="The workflow run was cancelled.")
        done = self._run_in_thread(attempt)
        self._keep_transcript(attempt)
        error = done.error
        if error is None:
            try:
                output = as_json(done.output, f"The output of node {node_id!r}")
            except InvalidInputError as invalid:
                return self._record(attempt, "failed", error=str(invalid))
            return self._record(attempt, "ok", output=output)
        if isinstance(error, AwaitInteraction):
            self._wait_for_interaction(attempt, error.request_id)
        if isinstance(error, EffectAmbiguous):
            raise _Parked("effectAmbiguous", str(error))
        outcome = "timed_out" if isinstance(error, NodeTimedOut) else "failed"
        if isinstance(error, NodeAborted) and attempt.signal.reason == "cancel":
            outcome = "cancelled"
        return self._record(
            attempt, outcome, error=describe(error), error_class=type(error).__name__
        )

    def _save_transcript_chunk(self, attempt: Attempt) -> None:
        """Save the attempt's new transcript entries when a chunk is due (see agents.py)."""
        if attempt.transcript is None:
            return
        chunk = attempt.transcript.unsaved_chunk(time.monotonic())
        if chunk is None:
            return
        transcript = {"nodeId": attempt.node_id, "attemptId": attempt.attempt_id}
        try:
            self.backend.record_transcript({**transcript, "entries": chunk, "partial": True})
        except FATAL_STORE_ERRORS:
            raise
        except Exception:  # a chunk that could not be saved costs only itself
            pass

    def _keep_transcript(self, attempt: Attempt) -> None:
        entries = attempt.transcript.entries() if attempt.transcript is not None else []
        if entries:
            self.backend.record_transcript(
                {"nodeId": attempt.node_id, "attemptId": attempt.attempt_id, "entries": entries}
            )

    def _wait_for_interaction(self, attempt: Attempt, request_id: str) -> None:
        self.state.update(
            status="waiting",
            waitingOn=attempt.node_id,
            statusDetail="waiting for the origin session",
        )
        self._persist(
            EventType.AGENT_PROMPT_SENT,
            "agent",
            {"prompt": attempt.prompt, "completion": "submit", "requestId": request_id},
            attempt.node_id,
            attempt.attempt_id,
        )
        raise _InteractionPending()

    def _run_in_thread(self, attempt: Attempt) -> _Done:
        context = self._context(attempt)
        thread, self._idle_thread = self._idle_thread or NodeThread(), None
        thread.run(f"piw-node-{attempt.node_id}", lambda: self._node_thread(attempt, context))
        timeout_ms = attempt.node.timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
        done: _Done | None = None
        try:
            while done is None:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                # The executor's thread creates the transcript; poll from the start.
                if attempt.node.node_type == "agent":
                    self._save_transcript_chunk(attempt)
                    poll = TRANSCRIPT_POLL_SECONDS
                    wait = poll if wait is None else min(wait, poll)
                try:
                    item = self._inbox.get(timeout=wait)
                except queue.Empty:
                    if deadline is None or time.monotonic() < deadline:
                        continue  # only a transcript poll
                    attempt.signal.abort("timeout")
                    done = _Done(
                        attempt,
                        error=NodeTimedOut(
                            f"Node {attempt.node_id!r} timed out after {timeout_ms} ms"
                        ),
                    )
                    break
                if isinstance(item, _BackendCall):
                    self._serve(item, attempt)
                elif isinstance(item, _Done) and item.attempt is attempt:
                    done = item
                    # Posting its result is the job's last act: the thread is free.
                    self._idle_thread = thread
                elif isinstance(item, _Stop) and self._stop == "park":
                    attempt.signal.abort("park")
                    raise _Parked("parked", "The workflow run was parked.")
                elif isinstance(item, _Stop):
                    attempt.signal.abort("cancel")
                    done = _Done(attempt, error=NodeAborted("The workflow run was cancelled."))
        finally:
            attempt.signal.abort("finished")
            if self._idle_thread is not thread:
                self._let_go(thread)
        self._settle_effect(attempt, done)
        return done

    def _let_go(self, thread: NodeThread) -> None:
        """Give a stopped attempt's thread a moment to return, refusing its backend calls;
        the next attempt gets the thread only if it did."""
        deadline = time.monotonic() + ABANDON_GRACE_SECONDS
        while not thread.wait_idle(0) and time.monotonic() < deadline:
            try:
                item = self._inbox.get(timeout=0.02)
            except queue.Empty:
                continue
            if isinstance(item, _BackendCall):
                item.error = NodeAborted("The node attempt is no longer active.")
                item.done.set()
            elif isinstance(item, _Stop):
                self._inbox.put(item)
                break
        if thread.wait_idle(0):
            self._idle_thread = thread

    def _serve(self, call: _BackendCall, active: Attempt) -> None:
        if call.attempt is not active or active.signal.is_aborted:
            call.error = NodeAborted("The node attempt is no longer active.")
            call.done.set()
            return
        try:
            call.result = getattr(self.backend, call.method)(call.payload)
        except FATAL_STORE_ERRORS as error:
            call.error = error
            call.done.set()
            active.signal.abort("claim lost")
            raise
        except Exception as error:
            call.error = error
        call.done.set()

    def _settle_effect(self, attempt: Attempt, done: _Done) -> None:
        effect = attempt.effect
        if effect is None:
            return
        if attempt.has_effect_result:
            settlement = {"outcome": "applied", "result": attempt.effect_result}
        elif done.error is not None and not isinstance(done.error, (NodeTimedOut, NodeAborted)):
            settlement = {"outcome": "rejected", "error": describe(done.error)}
        elif effect["policy"] == "idempotent":
            settlement = {"outcome": "rejected", "error": "stopped before it finished"}
        else:
            # A manual action stopped midway may or may not have happened.
            settlement = {"outcome": "ambiguous", "error": "stopped before it finished"}
        self.backend.settle_effect({"effectId": effect["effectId"], **settlement})

    def _record(
        self,
        attempt: Attempt,
        outcome: str,
        *,
        output: Any = None,
        error: str | None = None,
        error_class: str | None = None,
    ) -> dict[str, Any]:
        finished = now_ms()
        result: dict[str, Any] = {
            "attemptId": attempt.attempt_id,
            "nodeId": attempt.node_id,
            "nodeType": attempt.node.node_type,
            "outcome": outcome,
            "startedAt": attempt.started_at,
            "finishedAt": finished,
            "durationMs": finished - attempt.started_at,
        }
        if outcome == "ok":
            result["output"] = output
        else:
            result["error"] = error
        if error_class is not None:  # for observers (piw_node_attempt_finished)
            result["errorClass"] = error_class
        if attempt.agent is not None:
            result["agent"] = attempt.agent
        step = {**result, "output": output if outcome == "ok" else None, "prompt": attempt.prompt}
        if attempt.action is not None:
            step["action"] = attempt.action
        state = self.state
        state["results"][attempt.node_id] = result
        if outcome == "ok":
            state["outputs"][attempt.node_id] = output
        else:
            # A later failed attempt removes the node's earlier output.
            state["outputs"].pop(attempt.node_id, None)
        state["steps"].append(step)
        for key in CURRENT_FIELDS:
            state.pop(key, None)
        payload = {key: value for key, value in step.items() if key not in ("attemptId", "nodeId")}
        event_type = EventType.NODE_FINISHED if outcome == "ok" else EventType.NODE_FAILED
        self._persist(event_type, "node", payload, attempt.node_id, attempt.attempt_id)
        return result

    # --- inside the attempt thread -------------------------------------------------------

    def publisher(self, attempt: Attempt) -> Publish:
        def publish(type: str, key: str, data: dict[str, Any]) -> dict[str, Any]:
            check_update(type, key, data)
            self._updates.take()
            return self.call(
                attempt,
                "publish_update",
                {
                    "type": type,
                    "key": key,
                    "data": data,
                    "nodeId": attempt.node_id,
                    "attemptId": attempt.attempt_id,
                },
            )

        return publish

    def _context(self, attempt: Attempt) -> NodeContext:
        publish = self.publisher(attempt) if attempt.node.node_type == "action" else None
        state = copy.deepcopy(self.state)
        return NodeContext(
            input=state["input"],
            outputs=state["outputs"],
            results=state["results"],
            state=state,
            signal=attempt.signal,
            node_id=attempt.node_id,
            attempt_id=attempt.attempt_id,
            _publish=publish,
        )

    def call(self, attempt: Attempt, method: str, payload: dict[str, Any]) -> Any:
        """A backend call from the attempt thread, executed by the engine thread."""
        call = _BackendCall(attempt, method, payload)
        self._inbox.put(call)
        while not call.done.wait(0.05):
            attempt.signal.raise_if_aborted()
        if call.error is not None:
            raise call.error
        return call.result

    def _node_thread(self, attempt: Attempt, context: NodeContext) -> None:
        try:
            with registering_with(_AttemptProcesses(self, attempt)):
                output = run_node(self, attempt, context)
        except BaseException as error:  # every failure is the attempt's outcome
            self._inbox.put(_Done(attempt, error=error))
            return
        self._inbox.put(_Done(attempt, output=output))


def _check_recorded_answer(given: dict[str, Any], recorded: dict[str, Any] | None) -> None:
    """Only the recorded winner of a human decision may continue its run (one winner)."""
    decision_id = given.get("decisionId")
    if recorded is None or recorded["decisionId"] != decision_id:
        raise InvalidInputError(
            f"Decision {decision_id} has no recorded answer; a decision continues its run "
            "only once the host has recorded who won it."
        )
    if recorded["response"] != given.get("response"):
        raise InvalidInputError(
            f"The response given for decision {decision_id} is not the recorded answer."
        )


class _AttemptProcesses:
    """Registers the process groups an attempt starts, through the engine's store."""

    def __init__(self, engine: Engine, attempt: Attempt) -> None:
        self.engine = engine
        self.attempt = attempt

    def register(self, process_group: int, kind: str) -> None:
        self.engine.call(
            self.attempt, "register_process", {"processGroup": process_group, "kind": kind}
        )

    def unregister(self, process_group: int) -> None:
        self.engine.call(self.attempt, "unregister_process", {"processGroup": process_group})


class _RunProcesses:
    """Registers the process groups an executor starts for the whole run (early start)."""

    def __init__(self, backend: RunBackend) -> None:
        self.backend = backend

    def register(self, process_group: int, kind: str) -> None:
        self.backend.register_process({"processGroup": process_group, "kind": kind})

    def unregister(self, process_group: int) -> None:
        self.backend.unregister_process({"processGroup": process_group})


def _call_quietly(function: Any, argument: Any) -> Any:
    try:
        return function(argument)
    except Exception:
        return None


def execute_command(
    definition: Workflow, backend: RunBackend, command: dict[str, Any]
) -> dict[str, Any]:
    """Execute a worker run command (SPEC §7.3) to its next stop.

    Returns ``{runId, status, finalOutput?, error?, waitingOn?}`` where status is the run
    status, or ``parked`` (plus ``reason``: ``parked`` or ``effectAmbiguous``, and
    ``detail``) when the run stopped without a terminal state. To cancel or park from
    another thread, build an :class:`Engine` and call ``engine.execute(command)``.
    """
    return Engine(definition, backend).execute(command)
