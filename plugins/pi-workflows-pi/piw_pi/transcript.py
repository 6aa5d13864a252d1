"""What the agent did, from Pi's RPC event stream, into the engine's bounded transcript.

Kept: the prompts pi-workflows sent, the assistant's text, its tool calls and their results,
provider errors, extension errors and automatic retries. Streaming deltas, thinking and the
echo of user messages are left out; the engine's `AgentTranscript` cuts long values.
"""

from __future__ import annotations

from typing import Any

from pi_workflows.plugin import AgentTranscript


def content_text(content: Any) -> str:
    """The text parts of a Pi message content (a string or a list of parts), joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def record_event(transcript: AgentTranscript, event: dict[str, Any]) -> None:
    """Add what matters of one RPC event to `transcript`."""
    kind = event.get("type")
    if kind == "message_end":
        message = event.get("message") or {}
        if message.get("role") == "assistant":
            _record_assistant(transcript, message)
    elif kind == "tool_execution_end":
        result = event.get("result") or {}
        transcript.add(
            "tool_result",
            id=event.get("toolCallId"),
            name=event.get("toolName"),
            isError=bool(event.get("isError")),
            text=content_text(result.get("content")),
        )
    elif kind == "extension_error":
        transcript.add("error", source="extension", message=event.get("error"))
    elif kind == "auto_retry_start":
        transcript.add("retry", attempt=event.get("attempt"), message=event.get("errorMessage"))


def _record_assistant(transcript: AgentTranscript, message: dict[str, Any]) -> None:
    text = content_text(message.get("content"))
    if text.strip():
        transcript.add("assistant", text=text)
    for part in message.get("content") or []:
        if isinstance(part, dict) and part.get("type") == "toolCall":
            transcript.add(
                "tool_call",
                id=part.get("id"),
                name=part.get("name"),
                arguments=part.get("arguments"),
            )
    if message.get("stopReason") == "error":
        transcript.add(
            "error",
            source="provider",
            provider=message.get("provider"),
            model=message.get("model"),
            message=message.get("errorMessage"),
        )
