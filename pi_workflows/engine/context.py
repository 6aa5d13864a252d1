"""What node callbacks receive: the context and the abort signal of their attempt."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import PiWorkflowsError


class NodeAborted(PiWorkflowsError):
    """The attempt ended (timeout, cancel, park) while a callback was still working."""


class NodeTimedOut(PiWorkflowsError):
    """A deadline inside the node (e.g. a shell command's own `timeout_ms`) passed."""


class AbortSignal:
    """Set once when the attempt stops being active; callbacks may poll or wait on it.

    Python cannot interrupt a running function, so a callback that ignores the signal is
    abandoned: it keeps running, but its result and its store calls are refused.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def abort(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def is_aborted(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until aborted or `timeout` seconds passed; True when aborted."""
        return self._event.wait(timeout)

    def raise_if_aborted(self) -> None:
        if self._event.is_set():
            raise NodeAborted(f"The node attempt is no longer active ({self.reason}).")


@dataclass
class NodeContext:
    """`ctx` of every callback: the run input, earlier outputs and results, the state."""

    input: Any
    outputs: dict[str, Any]
    results: dict[str, Any]
    state: dict[str, Any]
    signal: AbortSignal
    node_id: str
    attempt_id: str
    _publish: Callable[[str, str, dict[str, Any]], dict[str, Any]] | None = field(
        default=None, repr=False
    )

    def publish_update(self, type: str, key: str, data: dict[str, Any]) -> dict[str, Any]:
        """Publish a non-terminal update (actions only); returns its receipt."""
        if self._publish is None:
            raise PiWorkflowsError(
                f"Node {self.node_id!r} cannot publish updates: only action nodes can."
            )
        return self._publish(type, key, data)


@dataclass(frozen=True)
class PresentationContext:
    """What a callable `presentation_prompt` receives once the run has its result."""

    state: dict[str, Any]
    final_output: Any
