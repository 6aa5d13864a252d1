"""Node kinds of the authoring API (SPEC §12): what an author writes in a workflow file.

Each helper validates its arguments eagerly and returns a frozen :class:`Node`; the
engine dispatches on ``node_type`` (``agent``, ``compute``, ``notify``, ``action``,
``checkpoint``) and the helpers built on them (``shell``, ``decision``,
``human_decision``) only fill in the fields of those kinds.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import WorkflowDefinitionError

DEFAULT_TIMEOUT_MS = 15 * 60 * 1000
DECISION_FIELD_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TEXT_INPUT_NAME_PATTERN = DECISION_FIELD_PATTERN
NOTIFY_KINDS = ("progress", "final")
DEFAULT_EXPECTED_OUTPUT = "a JSON object with your result"


def fail(message: str) -> WorkflowDefinitionError:
    """The error every definition check raises: one line, naming what is wrong."""
    return WorkflowDefinitionError(message)


def _check_callable(value: Any, what: str, *, allow_str: bool = False) -> None:
    if callable(value) or (allow_str and isinstance(value, str)):
        return
    kinds = "a string or a function" if allow_str else "a function"
    raise fail(f"{what} must be {kinds}, got {type(value).__name__}")


def _check_common(timeout_ms: Any, status_detail: Any, what: str) -> None:
    if timeout_ms is not None and (
        isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0
    ):
        raise fail(f"{what}: timeout_ms must be a positive integer or None, got {timeout_ms!r}")
    if status_detail is not None and not isinstance(status_detail, str):
        raise fail(f"{what}: status_detail must be a string, got {type(status_detail).__name__}")


@dataclass(frozen=True)
class Effect:
    """How a managed action recovers after a crash: `idempotent` reruns, `manual` parks."""

    policy: str
    type: str


def _effect(policy: str, type: str) -> Effect:
    if not isinstance(type, str) or not 1 <= len(type.strip()) <= 256:
        raise fail(f"{policy}_effect type must be a non-empty string of at most 256 characters")
    return Effect(policy, type.strip())


def idempotent_effect(type: str) -> Effect:
    """An effect that is safe to run again after an uncertain exit."""
    return _effect("idempotent", type)


def manual_effect(type: str) -> Effect:
    """An effect that must not run twice: an uncertain exit parks the run for an operator."""
    return _effect("manual", type)


@dataclass(frozen=True)
class TextInput:
    name: str
    prompt: str

    def snapshot(self) -> dict[str, Any]:
        return {"name": self.name, "prompt": self.prompt}


def text_input(name: str, prompt: str) -> TextInput:
    """A free-text field a human fills in together with a choice."""
    if not isinstance(name, str) or not TEXT_INPUT_NAME_PATTERN.match(name):
        raise fail(f"text_input name {name!r} must be a simple identifier")
    if not isinstance(prompt, str) or not prompt.strip():
        raise fail(f"text_input {name!r} needs a non-empty prompt")
    return TextInput(name, prompt)


@dataclass(frozen=True)
class Choice:
    label: str
    input: TextInput | None = None

    def snapshot(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"label": self.label}
        if self.input is not None:
            shape["input"] = self.input.snapshot()
        return shape


def choice(label: str, input: TextInput | None = None) -> Choice:
    """One answer a human can pick in a `human_decision`."""
    if not isinstance(label, str) or not label.strip():
        raise fail("choice label must be a non-empty string")
    if input is not None and not isinstance(input, TextInput):
        raise fail(f"choice {label!r}: input must come from text_input(...)")
    return Choice(label, input)


@dataclass(frozen=True)
class HumanDecisionSpec:
    audience: str
    choices: Mapping[str, Choice]
    request: Callable[[Any], Any]
    on_timeout: Mapping[str, Any] | None

    def snapshot(self) -> dict[str, Any]:
        shape: dict[str, Any] = {
            "audience": self.audience,
            "choices": {key: value.snapshot() for key, value in self.choices.items()},
        }
        if self.on_timeout is not None:
            shape["onTimeout"] = dict(self.on_timeout)
        return shape


@dataclass(frozen=True)
class Node:
    """One node of a workflow graph; callbacks are kept, never serialised."""

    node_type: str
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS
    status_detail: str | None = None
    # agent
    prompt: str | Callable[[Any], str] | None = None
    expected_output: str | None = None
    validate: Callable[[Any, Any], Any] | None = None
    route_field: str | None = None
    route_choices: tuple[str, ...] = ()
    # compute, action, checkpoint
    run: Callable[[Any], Any] | None = None
    # action
    effect: Effect | None = None
    exec: Callable[[Any], Mapping[str, Any]] | None = None
    parse: Callable[[Any, Any], Any] | None = None
    # notify
    message: str | Callable[[Any], str] | None = None
    notify_kind: str = "progress"
    # checkpoint
    summary: str | None = None
    human_decision: HumanDecisionSpec | None = None

    @property
    def is_shell(self) -> bool:
        return self.exec is not None

    def call(self, ctx: Any) -> Any:
        """The node's `run` function on `ctx` (a compute node, a function action)."""
        if self.run is None:
            raise TypeError(f"This {self.node_type} node has no run function to call.")
        return self.run(ctx)

    def shell_spec(self, ctx: Any) -> Mapping[str, Any]:
        """The command a shell action runs, from its `exec` function on `ctx`."""
        if self.exec is None:
            raise TypeError(f"This {self.node_type} node has no exec function to call.")
        return self.exec(ctx)

    def snapshot(self) -> dict[str, Any]:
        """The node in a definition snapshot: fixed values only, functions omitted."""
        shape: dict[str, Any] = {"nodeType": self.node_type, "timeoutMs": self.timeout_ms}
        if self.status_detail is not None:
            shape["statusDetail"] = self.status_detail
        if self.node_type == "agent":
            shape["expectedOutput"] = self.expected_output or DEFAULT_EXPECTED_OUTPUT
            if self.route_field is not None:
                # Named as before route() was: the digests of stored definitions stay the same.
                shape["decision"] = {
                    "field": self.route_field,
                    "choices": list(self.route_choices),
                }
        if self.node_type == "action":
            shape["actionExecution"] = "shell" if self.is_shell else "function"
            if self.effect is not None:
                shape["effect"] = {"policy": self.effect.policy, "type": self.effect.type}
        if self.node_type == "notify":
            shape["kind"] = self.notify_kind
        if self.node_type == "checkpoint":
            if self.summary is not None:
                shape["summary"] = self.summary
            if self.human_decision is not None:
                shape["humanDecision"] = self.human_decision.snapshot()
        return shape


def agent(
    prompt: str | Callable[[Any], str],
    expected_output: str | None = None,
    validate: Callable[[Any, Any], Any] | None = None,
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """A model step: the prompt goes to an agent, its JSON output becomes the node's.

    `validate(output, ctx)` checks each output the agent submits: raise to reject it (the
    agent gets the message and may submit again), return the value to keep (a normalised
    output, say), or return None to keep the submitted output unchanged. A step's output
    therefore cannot be made null by its validator.
    """
    _check_callable(prompt, "agent prompt", allow_str=True)
    if expected_output is not None and not isinstance(expected_output, str):
        raise fail("agent expected_output must be a string describing the output shape")
    if validate is not None:
        _check_callable(validate, "agent validate")
    _check_common(timeout_ms, status_detail, "agent")
    return Node(
        "agent",
        timeout_ms,
        status_detail,
        prompt=prompt,
        expected_output=expected_output,
        validate=validate,
    )


def compute(
    run: Callable[[Any], Any],
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """An inline pure function: data shaping and routing values."""
    _check_callable(run, "compute run")
    _check_common(timeout_ms, status_detail, "compute")
    return Node("compute", timeout_ms, status_detail, run=run)


def _check_effect(effect: Any, what: str) -> None:
    if not isinstance(effect, Effect):
        raise fail(
            f"{what} must declare effect=idempotent_effect(type) or manual_effect(type) so a "
            "crash can be recovered"
        )


def action(
    run: Callable[[Any], Any],
    effect: Effect,
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """A managed side effect: reserved before `run` is called and settled after."""
    _check_callable(run, "action run")
    _check_effect(effect, "action")
    _check_common(timeout_ms, status_detail, "action")
    return Node("action", timeout_ms, status_detail, run=run, effect=effect)


def shell(
    exec: Callable[[Any], Mapping[str, Any]],
    parse: Callable[[Any, Any], Any] | None = None,
    effect: Effect | None = None,
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """A managed command: `exec(ctx)` returns `{command, args?, cwd?, env?, stdin?, ...}`."""
    _check_callable(exec, "shell exec")
    if parse is not None:
        _check_callable(parse, "shell parse")
    _check_effect(effect, "shell")
    _check_common(timeout_ms, status_detail, "shell")
    return Node("action", timeout_ms, status_detail, exec=exec, parse=parse, effect=effect)


def notify(
    message: str | Callable[[Any], str],
    kind: str = "progress",
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """A durable notification to the run's origin session."""
    _check_callable(message, "notify message", allow_str=True)
    if kind not in NOTIFY_KINDS:
        raise fail(f"notify kind must be one of {', '.join(NOTIFY_KINDS)}, got {kind!r}")
    _check_common(timeout_ms, status_detail, "notify")
    return Node("notify", timeout_ms, status_detail, message=message, notify_kind=kind)


def checkpoint(
    summary: str | None = None,
    run: Callable[[Any], Any] | None = None,
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """Stop the run `waiting` for an answer; the answer continues it in a new run."""
    if summary is not None and not isinstance(summary, str):
        raise fail("checkpoint summary must be a string")
    if run is not None:
        _check_callable(run, "checkpoint run")
    _check_common(timeout_ms, status_detail, "checkpoint")
    return Node("checkpoint", timeout_ms, status_detail, summary=summary, run=run)


def route(
    question: str | Callable[[Any], str],
    choices: list[str] | tuple[str, ...],
    field: str = "route",
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """An agent's routing step: it must answer with one of `choices` in `field` (a
    `switch` on that field then routes the run)."""
    _check_callable(question, "route question", allow_str=True)
    if not isinstance(field, str) or not DECISION_FIELD_PATTERN.match(field):
        raise fail(f"route field {field!r} must be a simple identifier")
    options = tuple(choices) if isinstance(choices, (list, tuple)) else ()
    if not options or any(not isinstance(c, str) or not c for c in options):
        raise fail("route choices must be a non-empty list of non-empty strings")
    if len(set(options)) != len(options):
        raise fail(f"route choices must be unique, got {list(options)!r}")
    _check_common(timeout_ms, status_detail, "route")
    listed = " | ".join(f'"{c}"' for c in options)

    def prompt(ctx: Any) -> str:
        text = question(ctx) if callable(question) else question
        return (
            f"{text.rstrip()}\n\nAnswer by picking exactly one of: {listed}. "
            'Include a short "reason".'
        )

    def check(output: Any, ctx: Any) -> Any:
        if not isinstance(output, dict) or output.get(field) not in options:
            raise ValueError(f'the output must be an object whose "{field}" is one of {listed}')
        return output

    return Node(
        "agent",
        timeout_ms,
        status_detail,
        prompt=prompt,
        expected_output=f'{{"{field}": {listed}, "reason": "..."}}',
        validate=check,
        route_field=field,
        route_choices=options,
    )


def decision(
    question: str | Callable[[Any], str],
    choices: list[str] | tuple[str, ...],
    field: str = "route",
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """The old name of :func:`route`, kept for one release: "decision" now means a human
    decision only (:func:`human_decision`)."""
    warnings.warn(
        "decision() is now route(): it is an agent's routing step, and 'decision' means a "
        "human decision; decision() goes away in the next release.",
        DeprecationWarning,
        stacklevel=2,
    )
    return route(question, choices, field, timeout_ms=timeout_ms, status_detail=status_detail)


def human_decision(
    audience: str,
    choices: Mapping[str, Choice],
    request: Callable[[Any], Any],
    on_timeout: Mapping[str, Any] | None = None,
    *,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> Node:
    """A checkpoint only a human (or its declared timeout default) can answer."""
    if not isinstance(audience, str) or not audience.strip():
        raise fail("human_decision audience must be a non-empty string")
    if not isinstance(choices, Mapping) or not choices:
        raise fail("human_decision choices must be a non-empty mapping of key → choice(...)")
    for key, value in choices.items():
        if not isinstance(key, str) or not key or not isinstance(value, Choice):
            raise fail(f"human_decision choice {key!r} must map a string key to choice(...)")
    _check_callable(request, "human_decision request")
    if on_timeout is not None:
        after = on_timeout.get("after_ms") if isinstance(on_timeout, Mapping) else None
        response = on_timeout.get("response") if isinstance(on_timeout, Mapping) else None
        if isinstance(after, bool) or not isinstance(after, int) or after <= 0:
            raise fail("human_decision on_timeout needs a positive integer after_ms")
        if not isinstance(response, Mapping) or response.get("choice") not in choices:
            raise fail("human_decision on_timeout response must pick one of the choices")
    _check_common(timeout_ms, status_detail, "human_decision")
    spec = HumanDecisionSpec(audience, dict(choices), request, on_timeout)
    return Node("checkpoint", timeout_ms, status_detail, human_decision=spec)
