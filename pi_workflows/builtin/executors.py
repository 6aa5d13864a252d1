"""Built-in headless agent executor `command`: pipe the step prompt to a command.

The command is the ``agent_command`` setting (``PI_WORKFLOWS_AGENT_COMMAND`` or the settings
file; split like a shell would). It
gets the full step prompt on stdin, runs in its own process group and must print the
step output on stdout — JSON, or text containing JSON (parsed tolerantly).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from .. import settings
from ..engine.agents import AgentExecutorError
from ..engine.context import AbortSignal
from ..engine.shell import ShellCommandFailed, run_shell
from ..hookspecs import hookimpl
from ..records import AgentStepRequest, AgentStepResult


class CommandExecutor:
    """Runs one agent step as one command invocation."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    def run_agent_step(self, request: AgentStepRequest, signal: AbortSignal) -> AgentStepResult:
        contract = request["contract"]
        try:
            result = run_shell(
                {
                    "command": self.argv[0],
                    "args": self.argv[1:],
                    "stdin": request["prompt"],
                    "env": {
                        "PI_WORKFLOWS_RUN_ID": contract["runId"],
                        "PI_WORKFLOWS_NODE_ID": contract["nodeId"],
                        "PI_WORKFLOWS_ATTEMPT_ID": contract["attemptId"],
                    },
                },
                signal,
                kind="agent",
            )
        except ShellCommandFailed as error:
            raise AgentExecutorError(f"Agent command failed: {error}") from error
        return {"output": result["stdout"]}


def command_executor() -> CommandExecutor:
    raw = settings.optional_text("agent_command")
    if raw is None:
        # The default executor of a host started without settings: say how to pick one.
        raise AgentExecutorError(
            "The host's agent executor is 'command' and agent_command is not set: set the "
            "command that answers step prompts (`pi-workflows config set agent_command CMD`) "
            "or another executor (`pi-workflows config set agent_executor pi`), then "
            "`pi-workflows host restart`; `pi-workflows host status` shows the host's settings."
        )
    return CommandExecutor(shlex.split(raw))


@hookimpl
def piw_register_agent_executors(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("command", command_executor)
