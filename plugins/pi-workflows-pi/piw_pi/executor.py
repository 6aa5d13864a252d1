"""The headless agent executor `pi`: each agent step is done by the real Pi coding agent.

A step runs in a `pi --mode rpc --no-session` child (its own process group) that loads the
bridge extension (piw_pi/extensions/bridge/index.ts). The step prompt goes in as an RPC
`prompt`; the
model completes the step by calling the `workflow` tool with `submit`, which reaches
`PiStep.on_tool_call` through the bridge socket and is checked by the engine's `accept`
(tolerant parsing, the node's `validate`). A rejection goes back to the model as the tool's
error, in the same Pi session. A turn that ends without an accepted submit gets a reminder,
at most two; the next one fails the step with `missingSubmission`.

One pi serves the agent steps of a run one after another, with a fresh Pi session per step
(`new_session`): starting pi costs about a second, a new session a few milliseconds. The
first pi is started when the run starts in its worker (`prepare`), so whatever the run does
before its first agent step overlaps pi's start-up. A step
that fails or is aborted (timeout, cancel, pause) ends its pi with SIGTERM, then SIGKILL
after 3 s; when the worker dies, the bridge extension notices its socket closing and ends
pi itself.

Settings (environment): PI_WORKFLOWS_PI_COMMAND (the `pi` executable, split like a shell
would; default: the `pi` installed by `npm ci` next to this package, run on the Node `npm ci`
installed there with a compile cache (piw_pi/node.py) — or on the system's Node when there is
none — else `pi` on PATH),
PI_WORKFLOWS_PI_MODEL (passed as `--model`), PI_WORKFLOWS_PI_ARGS (extra arguments). Pi's own
configuration (HOME, PI_CODING_AGENT_DIR, PI_OFFLINE, API keys) passes through untouched.
"""

from __future__ import annotations

import os
import queue
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any

from pi_workflows.plugin import AbortSignal, AgentExecutorError, NodeAborted, setting_value

from .bridge_server import SOCKET_ENV, BridgeServer
from .models import known_model, model_name, requested_model
from .node import BRIDGE_EXTENSION, PI_COMMAND_ENV, pi_command, pi_on_bundled_node
from .rpc import PiProcess, PiProcessError, PiWaitStopped
from .transcript import record_event

MAX_REMINDERS = 2
START_TIMEOUT_SECONDS = 60.0
COMMAND_TIMEOUT_SECONDS = 30.0
# After an accepted submit the agent run normally ends at once (`terminate`); if the model
# keeps going, it is stopped after this long.
SETTLE_AFTER_ACCEPT_SECONDS = 5.0
EVENT_POLL_SECONDS = 0.05


def one_line(text: Any, limit: int = 400) -> str:
    """`text` with whitespace runs collapsed, cut to `limit` characters."""
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _split_setting(name: str, value: str) -> list[str]:
    """A setting split like a shell would; one it cannot split is the executor's error."""
    try:
        return shlex.split(value)
    except ValueError as error:  # an unclosed quote
        raise AgentExecutorError(
            f"The {name} setting cannot be split like a shell command ({error}); fix its "
            "quotes with 'pi-workflows config set' or its PI_WORKFLOWS_ variable."
        ) from None


@dataclass(frozen=True)
class PiSettings:
    """How to start pi, from PI_WORKFLOWS_PI_COMMAND, _MODEL and _ARGS."""

    command: tuple[str, ...]
    model: str | None
    extra_args: tuple[str, ...]

    @classmethod
    def from_environment(cls) -> PiSettings:
        raw = str(setting_value("pi_command") or "").strip()
        found = pi_command()
        if raw:
            command = tuple(_split_setting("pi_command", raw))
        elif (on_bundled_node := pi_on_bundled_node()) is not None:
            command = on_bundled_node
        elif found is not None:
            command = (found,)
        else:
            raise AgentExecutorError(
                "The 'pi' agent executor found no `pi`: run `npm ci` in "
                f"plugins/pi-workflows-pi, put `pi` on PATH, or set {PI_COMMAND_ENV}."
            )
        extra = _split_setting("pi_args", str(setting_value("pi_args") or ""))
        return cls(command, requested_model(), tuple(extra))

    def argv(self) -> list[str]:
        model = ["--model", self.model] if self.model else []
        return [
            *self.command,
            "--mode",
            "rpc",
            "--no-session",
            "-e",
            str(BRIDGE_EXTENSION),
            *model,
            *self.extra_args,
        ]


class PiSession:
    """A started pi with its bridge socket; serves one step at a time.

    Starting it only spawns pi; `ready()` waits until pi answers and checks that Pi knows
    its model. `signal` is the abort signal of the step being served: setting it ends any
    wait for pi.
    """

    def __init__(self, settings: PiSettings) -> None:
        self.settings = settings
        self.signal = AbortSignal()
        self.bridge = BridgeServer()
        env = {**os.environ, SOCKET_ENV: self.bridge.path}
        try:
            self.process = PiProcess(settings.argv(), env, os.getcwd())
        except BaseException:
            self.bridge.close()
            raise
        self.model: dict[str, Any] | None = None
        self.is_fresh = True

    @property
    def model_name(self) -> str:
        return model_name(self.model or {})

    def ready(self) -> None:
        """Wait for pi's first answer (once); a pi that cannot serve is closed."""
        if self.model is not None:
            return
        try:
            state = self._command({"type": "get_state"}, START_TIMEOUT_SECONDS)
            available = self._command({"type": "get_available_models"}, COMMAND_TIMEOUT_SECONDS)
            self.model = known_model(
                (state.get("data") or {}).get("model"),
                (available.get("data") or {}).get("models") or [],
                self.settings.model,
            )
        except BaseException:
            self.close()
            raise

    def _command(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            response = self.process.send(command, timeout, lambda: self.signal.is_aborted)
        except PiProcessError as error:
            raise AgentExecutorError(f"pi failed: {error}") from error
        except PiWaitStopped:
            raise NodeAborted(f"The agent step was stopped ({self.signal.reason}).") from None
        if not response.get("success"):
            raise AgentExecutorError(
                f"pi refused {command['type']!r}: {one_line(response.get('error'))}"
            )
        return response

    def start_fresh_session(self) -> None:
        """A new, empty Pi session for the next step (the first step already has one)."""
        if not self.is_fresh:
            self._command({"type": "new_session"}, COMMAND_TIMEOUT_SECONDS)
        self.is_fresh = False

    def prompt(self, text: str) -> None:
        try:
            self._command({"type": "prompt", "message": text}, COMMAND_TIMEOUT_SECONDS)
        except AgentExecutorError as error:
            raise AgentExecutorError(f"{self.model_name} via pi: {error}") from error

    def abort_turn(self) -> None:
        self.process.write({"type": "abort"})

    def next_event(self) -> dict[str, Any] | None:
        try:
            return self.process.events.get(timeout=EVENT_POLL_SECONDS)
        except queue.Empty:
            return None

    def close(self) -> None:
        """End pi's process group (SIGTERM, SIGKILL after 3 s), then the bridge socket."""
        self.process.terminate()
        self.bridge.close()


class PiStep:
    """One agent step on a `PiSession`: prompt, tool calls, reminders, the outcome."""

    def __init__(self, session: PiSession, request: dict[str, Any], signal: AbortSignal) -> None:
        self.session = session
        self.request = request
        self.contract = request["contract"]
        self.signal = signal
        self.transcript = request["transcript"]
        self.accepted: tuple[Any] | None = None
        self._accepted_at: float | None = None
        self._update_replies: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._usage: dict[str, int] = {}

    def run(self) -> dict[str, Any]:
        self.session.bridge.handler = self.on_tool_call
        try:
            self._prompt(self.request["prompt"], "initial")
            reminders = 0
            while True:
                end = self._until_agent_end()
                _add_usage(self._usage, end)
                if self.accepted is not None:
                    return self._answer(self.accepted[0])
                failure = _provider_failure(end)
                if failure is not None:
                    raise AgentExecutorError(failure)
                if reminders == MAX_REMINDERS:
                    raise AgentExecutorError(
                        f"missingSubmission: the agent ended {MAX_REMINDERS + 1} turns without "
                        f"an accepted `workflow` submit for step {self.contract['nodeId']!r} "
                        f"({MAX_REMINDERS} reminders sent)."
                    )
                reminders += 1
                self._prompt(self._reminder(reminders), "reminder")
        except NodeAborted:
            self.transcript.add("ended", reason=self.signal.reason)
            raise
        finally:
            self.session.bridge.handler = None

    def _answer(self, output: Any) -> dict[str, Any]:
        # Who answered and what it cost reach the node-attempt hooks (an OTel span, say).
        model = self.session.model or {}
        answer: dict[str, Any] = {"output": output, "usage": self._usage}
        for key, value in (("provider", model.get("provider")), ("model", model.get("id"))):
            if isinstance(value, str):
                answer[key] = value
        return answer

    def _prompt(self, text: str, reason: str) -> None:
        # The transcript names who answers: the provider and model this pi prompts.
        model = self.session.model or {}
        self.transcript.add(
            "prompt",
            reason=reason,
            provider=model.get("provider"),
            model=model.get("id"),
            text=text,
        )
        self.session.prompt(text)

    def _reminder(self, number: int) -> str:
        node_id, attempt_id = self.contract["nodeId"], self.contract["attemptId"]
        expected = self.contract.get("expectedOutput") or "a JSON object with your result"
        return (
            f"Reminder {number} of {MAX_REMINDERS}: workflow step {node_id!r} is not complete. "
            "It is complete only when the `workflow` tool accepts your output. Call it now with:\n"
            f'{{"action":"submit","step":"{node_id}","attempt":"{attempt_id}",'
            '"output":<your result>}\n'
            f"Expected output: {expected}"
        )

    def _until_agent_end(self) -> dict[str, Any]:
        """Record events until the agent run ends; abort and pi's exit end the step."""
        while True:
            if self.signal.is_aborted:
                raise NodeAborted(f"The agent step was stopped ({self.signal.reason}).")
            self._stop_if_talking_after_accept()
            event = self.session.next_event()
            if event is None:
                continue
            if event.get("type") == "_exited":
                description = self.session.process.exit_description()
                self.transcript.add("error", source="pi", message=description)
                raise AgentExecutorError(f"{description} during step {self.contract['nodeId']!r}")
            record_event(self.transcript, event)
            if event.get("type") == "agent_end":
                return event

    def _stop_if_talking_after_accept(self) -> None:
        accepted_at = self._accepted_at
        if accepted_at is not None and time.monotonic() - accepted_at > SETTLE_AFTER_ACCEPT_SECONDS:
            self._accepted_at = None
            self.session.abort_turn()

    # --- the `workflow` tool, called from the bridge socket's thread ----------------------

    def on_tool_call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Answer one `workflow` tool call: ``{ok, text?, terminate?}`` or ``{ok, error}``."""
        args = message.get("args") if isinstance(message.get("args"), dict) else {}
        node_id, attempt_id = self.contract["nodeId"], self.contract["attemptId"]
        if args.get("step") != node_id:
            return _refused(
                f"This is workflow step {node_id!r}, not {args.get('step')!r}; use the step "
                "id from the step contract."
            )
        if args.get("attempt") != attempt_id:
            return _refused(
                f"Attempt {args.get('attempt')!r} is not the current attempt of step "
                f"{node_id!r}; use the attempt id from the latest step contract."
            )
        action = message.get("type")
        if action == "submit":
            return self._submit(args)
        if action == "update":
            return self._update(str(message.get("toolCallId") or ""), args)
        return _refused(f"Unknown workflow action {action!r}; use 'submit' or 'update'.")

    def _submit(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self.accepted is not None:
                return {"ok": True, "text": "This step is already complete.", "terminate": True}
            if "output" not in args:
                return _refused('submit needs "output": the step result the contract describes.')
            verdict = self.request["accept"](args["output"])
            if not verdict["ok"]:
                return _refused(
                    f"The workflow rejected this output: {verdict['error']} "
                    "Correct the output and submit again."
                )
            self.accepted = (verdict["value"],)
            self._accepted_at = time.monotonic()
        return {"ok": True, "text": "Accepted: the workflow step is complete.", "terminate": True}

    def _update(self, tool_call_id: str, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if tool_call_id and tool_call_id in self._update_replies:
                return self._update_replies[tool_call_id]
        update = args.get("update")
        if not isinstance(update, dict):
            return _refused('update needs "update": {"type": ..., "key": ..., "data": {...}}.')
        try:
            receipt = self.request["publish_update"](
                update.get("type"), update.get("key"), update.get("data")
            )
        except NodeAborted:
            return _refused("This workflow step has ended; the update was not published.")
        except Exception as error:  # a refused envelope goes back to the model
            return _refused(f"The update was refused: {error}")
        reply = {"ok": True, "text": f"Update published (sequence {receipt.get('sequence')})."}
        with self._lock:
            if tool_call_id:
                self._update_replies[tool_call_id] = reply
        return reply


def _refused(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


# Pi's token counts of one assistant message (`Usage` in pi-ai; its `cost` is dollars).
USAGE_COUNTS = ("input", "output", "cacheRead", "cacheWrite", "totalTokens")


def _add_usage(total: dict[str, int], agent_end: dict[str, Any]) -> None:
    """Add the token counts of an agent run's assistant messages to `total`: an agent
    step may take several runs (reminders), and `agent_end` lists only its own messages."""
    for message in agent_end.get("messages") or []:
        usage = message.get("usage") if message.get("role") == "assistant" else None
        if not isinstance(usage, dict):
            continue
        for key in USAGE_COUNTS:
            count = usage.get(key)
            if isinstance(count, int) and not isinstance(count, bool):
                total[key] = total.get(key, 0) + count


def _provider_failure(agent_end: dict[str, Any]) -> str | None:
    """`The model P/M failed: ...` when the agent run ended on a provider error."""
    for message in reversed(agent_end.get("messages") or []):
        if message.get("role") != "assistant":
            continue
        if message.get("stopReason") != "error":
            return None
        name = f"{message.get('provider')}/{message.get('model')}"
        detail = one_line(message.get("errorMessage") or "no error message")
        return f"The model {name} failed: {detail}"
    return None


class PiExecutor:
    """Runs agent steps on pi; keeps an idle pi per process for the next step of the run."""

    def __init__(self, settings: PiSettings) -> None:
        self.settings = settings
        self._idle: list[PiSession] = []
        self._lock = threading.Lock()

    def run_agent_step(self, request: dict[str, Any], signal: AbortSignal) -> dict[str, Any]:
        session = self._take_session(signal)
        try:
            session.start_fresh_session()
            answer = PiStep(session, request, signal).run()
        except BaseException:
            session.close()
            raise
        with self._lock:
            self._idle.append(session)
        return answer

    def prepare(self) -> None:
        """Start a pi for the run's next agent step now, without waiting for it (the
        engine calls this when a headless run with agent steps starts in a worker)."""
        with self._lock:
            if not self._idle:
                self._idle.append(PiSession(self.settings))

    def _take_session(self, signal: AbortSignal) -> PiSession:
        session = None
        with self._lock:
            while self._idle and session is None:
                candidate = self._idle.pop()
                if candidate.process.is_running:
                    session = candidate
                else:
                    candidate.close()
        if session is None:
            session = PiSession(self.settings)
        session.signal = signal
        session.ready()
        return session

    def close(self) -> None:
        """End every idle pi."""
        with self._lock:
            idle, self._idle = self._idle, []
        for session in idle:
            session.close()


_executors: dict[PiSettings, PiExecutor] = {}
_executors_lock = threading.Lock()


def pi_executor() -> PiExecutor:
    """The factory registered as `pi`: one executor per settings, so steps share an idle pi."""
    settings = PiSettings.from_environment()
    with _executors_lock:
        if settings not in _executors:
            _executors[settings] = PiExecutor(settings)
        return _executors[settings]
