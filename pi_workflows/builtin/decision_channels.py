"""Built-in decision channels: ``session`` (the origin session) and ``cli``.

``session`` delivers a ``decision`` workflow message to the run's origin session; the
session answers with ``decision.answer {channel: "session", sessionId}``. ``cli``
delivers nothing: ``pi-workflows decision list`` shows pending decisions and
``pi-workflows decision answer`` answers them. Who answers through ``decision.answer``
is each channel's rule (``answer_actor``): the local user for ``cli``, only the origin
session for ``session``.
"""

from __future__ import annotations

import functools
import os
import pwd
from typing import Any

from ..errors import AnswerNotAllowedError
from ..hookspecs import hookimpl
from ..records import ChannelGaveUp, MessageContent, RegisterChannel

# The message key: revision 1 of the request, first presentation (SPEC §9.2).
DECISION_MESSAGE_KEY = "1:initial"


def render_decision_text(request: dict[str, Any]) -> str:
    """The plain-text presentation: title, summary, blocks, default, choices."""
    presentation = request["presentation"]
    lines = [request["title"]]
    if presentation.get("summary"):
        lines += ["", presentation["summary"]]
    for block in presentation["blocks"]:
        lines.append("")
        kind = block["type"]
        if kind == "section":
            lines.append(f"## {block['title']}")
        elif kind == "bullets":
            lines += [f"• {item}" for item in block["items"]]
        elif kind == "fields":
            lines += [f"{item['label']}: {item['value']}" for item in block["items"]]
        else:
            lines.append(block["text"])
    default = request.get("defaultResponse")
    if request.get("expiresAt") and default:
        label = request["choices"][default["choice"]]["label"]
        lines += [
            "",
            f"If no answer is accepted by {request['expiresAt']}, this decision continues "
            f"automatically with: {label}.",
        ]
    lines += ["", "Choices:"]
    for key, choice in request["choices"].items():
        text_input = choice.get("input")
        extra = f"; input: {text_input['prompt']}" if text_input else ""
        lines.append(f"- {key}: {choice['label']}{extra}")
    return "\n".join(lines)


class _QuietSettlement:
    """Channels with nothing to take back once a decision is resolved: they have no
    `settle`, so the host records each settlement applied in the commit that resolved
    the decision, without calling them."""

    def __init__(self, context: Any) -> None:
        self.context = context


class SessionChannel(_QuietSettlement):
    """A `decision` workflow message in the run's origin session.

    Settling needs nothing more: resolving the decision cancelled its pending message in
    the same transaction, and a message the session has shown stays in its transcript.
    """

    def answer_actor(self, answer: dict[str, Any]) -> str:
        """Only the run's origin session answers through this channel."""
        origin = answer["originSessionId"]
        if origin is None or answer["sessionId"] != origin:
            raise AnswerNotAllowedError(
                f"Only the origin session of run {answer['runId']} may answer decision "
                f"{answer['decisionId']} through the session channel."
            )
        # The session id itself is never stored as an actor name (it is a secret handle).
        return "origin-session"

    def deliver(self, request: dict[str, Any]) -> dict[str, Any]:
        def write() -> dict[str, Any]:
            # Imported on use: every process loads this plugin, a worker's fork server
            # too, and only a host delivering a decision needs the storage layer.
            from ..storage import decision_records
            from ..storage.runs import origin_session_id
            from ..storage.workflow_messages import create_workflow_message

            decision_id, run_id = request["decisionId"], request["runId"]
            session_id = origin_session_id(run_id)
            if session_id is None:
                return {"delivered": False, "reason": "the run has no origin session"}
            if decision_records.get_decision(decision_id).status != "pending":
                return {"delivered": False, "reason": "already resolved"}
            text = render_decision_text(request) + (
                "\n\nA human must answer this protected decision "
                f"(pi-workflows decision answer {decision_id} CHOICE)."
            )
            message, _ = create_workflow_message(
                run_id=run_id,
                target_session_id=session_id,
                kind="decision",
                source_id=decision_id,
                idempotency_key=DECISION_MESSAGE_KEY,
                content=MessageContent(
                    text,
                    {
                        "kind": "decision",
                        "decisionId": decision_id,
                        "runId": run_id,
                        "choices": request["choices"],
                    },
                ),
            )
            return {"delivered": True, "workflowMessageId": message.workflow_message_id}

        return self.context.store_call(write)


class CliChannel(_QuietSettlement):
    """Nothing to push: the CLI lists and answers decisions through the host. Without
    `deliver`, its delivery is recorded in the commit that created the decision."""

    def answer_actor(self, answer: dict[str, Any]) -> str:
        """The host's socket is private to its owner, so a CLI client is that user."""
        return _host_user()


@functools.cache
def _host_user() -> str:
    """The name of the user the host runs as (looked up once: it reads the user database)."""
    return pwd.getpwuid(os.getuid()).pw_name


@hookimpl
def piw_register_decision_channels(register: RegisterChannel) -> None:
    register("session", SessionChannel)
    register("cli", CliChannel)


@hookimpl
def piw_channel_gave_up(gave_up: ChannelGaveUp) -> None:
    """Tell the channel itself, when it has the optional ``gave_up`` method: what it does
    about it (page someone, say) is its business."""
    tell = getattr(gave_up.channel, "gave_up", None)
    if tell is not None:
        tell(gave_up.request, gave_up.purpose, gave_up.error)
