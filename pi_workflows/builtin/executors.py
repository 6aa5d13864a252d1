"""Built-in headless agent executor `command`: pipe the step prompt to a command.

The command comes from ``PI_WORKFLOWS_AGENT_COMMAND`` (split like a shell would). It
gets the full step prompt on stdin, runs in its own process group and must print the
step output on stdout — JSON, or text containing JSON (parsed tolerantly).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any

from ..engine.agents import AgentExecutorError
from ..engine.context import AbortSignal
from ..engine.shell import ShellCommandFailed, run_shell
from ..hookspecs import hookimpl
from ..records import AgentStepRequest, AgentStepResult

COMMAND_ENV = "PI_WORKFLOWS_AGENT_COMMAND"


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
    raw = os.environ.get(COMMAND_ENV, "").strip()
    if not raw:
        raise AgentExecutorError(
            f"The 'command' agent executor needs {COMMAND_ENV} set to the command that "
            "answers step prompts."
        )
    return CommandExecutor(shlex.split(raw))


@hookimpl
def piw_register_agent_executors(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("command", command_executor)
