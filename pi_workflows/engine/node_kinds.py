"""What an attempt of each node kind does (engine.md §4): one small handler per kind,
found in `HANDLERS` by the node's type.

A handler runs in the attempt's helper thread. It reaches the run only through the
`StepRun` it is given (the engine): backend calls go through `StepRun.call`, which the
engine thread serves, so the backend still sees one caller at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .. import plugins, settings
from ..authoring.nodes import Node
from ..errors import InvalidInputError
from ..limits import checked_prompt
from ..records import StepContract
from .agents import AgentExecutor, AgentTranscript, parse_output
from .attempt import Attempt, AwaitInteraction, EffectAmbiguous, as_json, describe
from .context import NodeContext
from .shell import run_shell

Publish = Callable[[str, str, dict[str, Any]], dict[str, Any]]


class StepRun(Protocol):
    """What a node handler may use of the run it is a step of."""

    run_id: str

    @property
    def workflow_name(self) -> str: ...

    @property
    def is_interactive(self) -> bool:
        """Agent steps go to the run's origin session (else to the agent executor)."""
        ...

    @property
    def agent_executor(self) -> AgentExecutor: ...

    def call(self, attempt: Attempt, method: str, payload: dict[str, Any]) -> Any:
        """A backend call (engine.md §3), made from the attempt's thread."""
        ...

    def publisher(self, attempt: Attempt) -> Publish: ...


Handler = Callable[[StepRun, Attempt, NodeContext], Any]


def run_node(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    """The attempt's output, by its node kind's handler."""
    return HANDLERS[attempt.node.node_type](run, attempt, ctx)


def _compute(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    return attempt.node.call(ctx)


def _notify(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    node = attempt.node
    content = node.message(ctx) if callable(node.message) else node.message
    if not isinstance(content, str) or not content.strip():
        raise InvalidInputError(f"Notify node {attempt.node_id!r} produced an empty message.")
    # Stable across a crash retry (same index → deduplicated), new on loop re-entry.
    index = 1 + sum(
        1
        for step in ctx.state["steps"]
        if step["nodeId"] == attempt.node_id and step["outcome"] == "ok"
    )
    receipt = run.call(
        attempt,
        "request_notification",
        {
            "workflowName": run.workflow_name,
            "nodeId": attempt.node_id,
            "attemptId": attempt.attempt_id,
            "notificationIndex": index,
            "kind": node.notify_kind,
            "content": content.strip(),
        },
    )
    return {
        "notificationId": receipt["notificationId"],
        "targetSessionId": receipt["targetSessionId"],
    }


def _action(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    node = attempt.node
    assert node.effect is not None
    spec = node.shell_spec(ctx) if node.is_shell else None
    visit = 1 + sum(1 for step in ctx.state["steps"] if step["nodeId"] == attempt.node_id)
    reservation = run.call(
        attempt,
        "reserve_effect",
        {
            "effectType": node.effect.type,
            "policy": node.effect.policy,
            "idempotencyKey": f"{run.run_id}:{node.effect.type}:{attempt.node_id}:{visit}",
            "payload": {"nodeId": attempt.node_id, "exec": as_json(spec, "shell exec")},
            "nodeId": attempt.node_id,
            "attemptId": attempt.attempt_id,
        },
    )
    outcome = reservation["outcome"]
    if outcome == "ambiguous":
        raise EffectAmbiguous(
            f"Effect {node.effect.type!r} of node {attempt.node_id!r} may or may not have "
            "been applied; check it, then resolve the effect or cancel the run."
        )
    if outcome == "conflict":
        raise InvalidInputError(reservation["error"])
    if outcome == "adopted":
        raw = reservation["result"]
    else:
        attempt.effect = {"effectId": reservation["effectId"], "policy": node.effect.policy}
        if spec is not None:
            raw = run_shell(spec, attempt.signal)
        else:
            raw = node.call(ctx)
        raw = as_json(raw, f"The result of action {attempt.node_id!r}")
        attempt.effect_result, attempt.has_effect_result = raw, True
    if node.is_shell:
        # An operator-confirmed result (`effects confirm`) may have only some fields.
        described = raw if isinstance(raw, dict) else {}
        attempt.action = {"actionType": "shell"} | {
            key: described.get(key)
            for key in ("command", "args", "cwd", "exitCode", "signal", "durationMs")
        }
        return node.parse(raw, ctx) if node.parse is not None else raw
    attempt.action = {"actionType": "function"}
    return raw


def _checkpoint(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    node = attempt.node
    if node.human_decision is not None:
        return _human_decision(run, attempt, ctx)
    if node.run is not None:
        return node.run(ctx)
    return {"summary": node.summary or "checkpoint"}


def _human_decision(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    spec = attempt.node.human_decision
    assert spec is not None
    request = spec.request(ctx)
    where = f"human_decision {attempt.node_id!r}"
    if not isinstance(request, dict) or not isinstance(request.get("title"), str):
        raise InvalidInputError(f"{where}: request must return a dict with a 'title'")
    presentation = request.get("presentation")
    if not isinstance(presentation, dict) or not isinstance(presentation.get("blocks", []), list):
        raise InvalidInputError(f"{where}: request needs a 'presentation' with 'blocks'")
    record = run.call(
        attempt,
        "create_human_decision_request",
        {
            "nodeId": attempt.node_id,
            "attemptId": attempt.attempt_id,
            "audience": spec.audience,
            "title": request["title"],
            "subject": as_json(request.get("subject"), f"{where} subject"),
            "presentation": {
                "schema": "pi-workflows.decision-presentation.v1",
                **as_json(presentation, f"{where} presentation"),
            },
            "choices": {key: value.snapshot() for key, value in spec.choices.items()},
            "onTimeout": dict(spec.on_timeout) if spec.on_timeout else None,
        },
    )
    record.pop("revision", None)
    return record


def _agent(run: StepRun, attempt: Attempt, ctx: NodeContext) -> Any:
    node = attempt.node
    authored = node.prompt(ctx) if callable(node.prompt) else node.prompt
    if not isinstance(authored, str) or not authored.strip():
        raise InvalidInputError(f"Agent node {attempt.node_id!r} produced an empty prompt.")
    contract: StepContract = {
        "runId": run.run_id,
        "workflowName": run.workflow_name,
        "nodeId": attempt.node_id,
        "attemptId": attempt.attempt_id,
        "expectedOutput": node.expected_output,
        "completion": "submit",
    }
    attempt.prompt = checked_prompt(plugins.step_prompt(contract, authored), attempt.node_id)
    if run.is_interactive:
        receipt = run.call(
            attempt,
            "request_interaction",
            {
                "nodeId": attempt.node_id,
                "attemptId": attempt.attempt_id,
                "kind": "agent",
                "prompt": attempt.prompt,
                "contract": contract,
                "presentation": {"statusDetail": node.status_detail},
                "timeoutMs": node.timeout_ms,
            },
        )
        raise AwaitInteraction(receipt["requestId"])
    executor = run.agent_executor
    attempt.transcript = AgentTranscript()
    attempt.agent = {"executor": settings.value("agent_executor")}

    def accept(output: Any) -> dict[str, Any]:
        try:
            value = checked_agent_output(node, output, ctx)
        except Exception as error:  # the agent gets the reason and may submit again
            return {"ok": False, "error": rejection(error)}
        attempt.accepted_output = (value,)
        return {"ok": True, "value": value}

    answer = executor.run_agent_step(
        {
            "contract": contract,
            "prompt": attempt.prompt,
            "presentation": {"statusDetail": node.status_detail},
            "accept": accept,
            "publish_update": run.publisher(attempt),
            "transcript": attempt.transcript,
        },
        attempt.signal,
    )
    attempt.agent.update(_agent_report(answer))
    if attempt.accepted_output is not None:
        return attempt.accepted_output[0]
    return checked_agent_output(
        node, answer.get("output") if isinstance(answer, dict) else answer, ctx
    )


HANDLERS: dict[str, Handler] = {
    "compute": _compute,
    "notify": _notify,
    "action": _action,
    "checkpoint": _checkpoint,
    "agent": _agent,
}


def checked_agent_output(node: Node, output: Any, ctx: NodeContext) -> Any:
    """engine.md §4.5: tolerant parse, the node's validator, then the JSON round trip.

    A validator returns the value to keep, or None to keep the submission as it is: a
    validator that only raises on bad output must not turn good output into null.
    """
    value = parse_output(output)
    if node.validate is not None:
        kept = node.validate(value, ctx)
        if kept is not None:
            value = kept
    return as_json(value, "The agent output")


def rejection(error: BaseException) -> str:
    """Why a validator refused an agent's output, as the agent is told: a `ValueError`
    (how `validate` rejects) is its message alone; anything else names its type, since it
    is more likely a bug than a verdict."""
    if isinstance(error, ValueError) and str(error):
        return str(error)
    return describe(error)


def _agent_report(answer: Any) -> dict[str, Any]:
    """What an executor's result reports of who answered (records.AgentStepResult):
    ``provider`` and ``model`` names and ``usage`` token counts; anything else, or of
    another shape, is left out, so a plugin cannot put non-JSON in the run state."""
    if not isinstance(answer, dict):
        return {}
    report = {key: answer[key] for key in ("provider", "model") if isinstance(answer.get(key), str)}
    usage = answer.get("usage")
    if isinstance(usage, dict) and all(
        isinstance(name, str) and isinstance(count, int) and not isinstance(count, bool)
        for name, count in usage.items()
    ):
        report["usage"] = dict(usage)
    return report
