"""A real host, the scripted model and real `pi` processes with the session extension loaded.

A `WorkflowPi` (fixture `pi_session`): `start()` runs `pi --mode rpc` with the
pi-workflows extension against the harness host; `entries()` reads the workflow messages
Pi's session holds (over RPC `get_messages`); `host_messages()` reads the host's side.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from piw_pi.node import SESSION_EXTENSION

from tests.host.conftest import FAST_TIMERS, HostHarness
from tests.pi.model_server import ScriptedModelServer, Text, ToolCall, ToolCalls
from tests.pi.offline_pi import PiHome, PiRpc
from tests.polling import wait_until

CLI = f"{sys.executable} -m pi_workflows"


def submit(step: str, output: Any, text: str = "") -> ToolCalls:
    """The model's call of the `workflow` tool that submits `output` for `step`."""
    return ToolCalls(
        ToolCall("workflow", {"action": "submit", "step": step, "output": output}), text=text
    )


def two_turn_script() -> list[Any]:
    """The model's side of a whole `two-turn` run: three steps, then the explanation."""
    return [
        submit("inspect", {"findings": ["README.md", "pyproject.toml"], "repoSummary": "a demo"}),
        Text("Inspected."),
        submit("draft", {"draft": "Add a changelog."}),
        Text("Drafted."),
        submit("checklist", {"checklist": ["write CHANGELOG.md"], "references": ["README.md"]}),
        Text("Checklist done."),
        Text("The two-turn workflow completed: a plan to add a changelog."),
    ]


class WorkflowPi:
    def __init__(self, host: HostHarness, pi_home: PiHome, server: ScriptedModelServer) -> None:
        self.harness = host
        self.pi_home = pi_home
        self.server = server
        self.children: list[PiRpc] = []

    def env(self, session_id: str | None = None, **extra: str) -> dict[str, str]:
        env = {
            "PI_WORKFLOWS_HOME": str(self.harness.home.root),
            "PI_WORKFLOWS_CONFIG_DIR": str(self.harness.config),
            "PI_WORKFLOWS_CLI": CLI,
            "PYTHONUNBUFFERED": "1",
            **FAST_TIMERS,
            **extra,
        }
        if session_id is not None:
            env["PI_WORKFLOWS_SESSION_ID"] = session_id
        return env

    def start(
        self,
        session_id: str | None = None,
        extra_args: list[str] | None = None,
        plain: Path | None = None,
        **extra: str,
    ) -> PiRpc:
        """A pi with the extension: given with `-e`, or — for a `plain` pi executable — the
        one its settings load."""
        loaded = [] if plain else ["-e", str(SESSION_EXTENSION)]
        child = PiRpc(
            self.pi_home, [*loaded, *(extra_args or [])], self.env(session_id, **extra), plain
        )
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in self.children:
            child.close()

    # --- what Pi holds ----------------------------------------------------------------------

    @staticmethod
    def messages(pi: PiRpc) -> list[dict[str, Any]]:
        response = pi.send({"type": "get_messages"})
        assert response["success"], response
        return response["data"]["messages"]

    def entries(self, pi: PiRpc) -> list[dict[str, Any]]:
        """The custom messages in Pi's branch that carry a workflow message id."""
        return [
            m
            for m in self.messages(pi)
            if m.get("role") == "custom" and (m.get("details") or {}).get("workflowMessageId")
        ]

    def shown_once(self, *pis: PiRpc) -> Counter:
        """The workflow messages in the branches of `pis`, asserting each is there once."""
        shown = Counter(e["details"]["workflowMessageId"] for pi in pis for e in self.entries(pi))
        assert all(count == 1 for count in shown.values()), shown
        return shown

    @staticmethod
    def notices(pi: PiRpc) -> list[str]:
        return [
            e["message"]
            for e in pi.events
            if e.get("type") == "extension_ui_request" and e.get("method") == "notify"
        ]

    @staticmethod
    def session_id(pi: PiRpc) -> str:
        return pi.send({"type": "get_state"})["data"]["sessionId"]

    # --- what the host holds ----------------------------------------------------------------

    def host_messages(self, session_id: str) -> list[dict[str, Any]]:
        result = self.harness.cli("session", "messages", session_id, "--json")
        return json.loads(result.stdout)

    def runs(self) -> list[dict[str, Any]]:
        return json.loads(self.harness.cli("run", "list", "--json").stdout)

    def wait_for_run(self, *statuses: str, timeout: float = 60.0) -> dict[str, Any]:
        return wait_until(
            lambda: next((r for r in self.runs() if r["status"] in statuses), None),
            timeout=timeout,
            what=f"a run in {statuses}",
        )

    def turns(self, session_id: str) -> list[tuple]:
        return self.harness.query(
            "SELECT workflow_turn_id, workflow_message_id, state, stop_reason "
            "FROM workflow_turns WHERE target_session_id = ? ORDER BY started_at",
            session_id,
        )

    def turns_ended_as(self, session_id: str, expected: list[str]) -> bool:
        """The session's turns all ended, with the stop reasons `expected`, oldest first.

        One exception, the one SPEC makes: the run can end before the turn of its last
        step (the turn before the terminal message's) reports its end. The host then ends
        that open turn `lost` (§7.5) and adopts the late `ended` report with the saved
        turn (§9.4), so where `completed` is expected that turn may read `lost`.
        """
        turns = self.turns(session_id)
        if len(turns) != len(expected) or any(t[2] != "ended" for t in turns):
            return False
        last_step = len(expected) - 2
        return all(
            turn[3] == wanted
            or (index == last_step and wanted == "completed" and turn[3] == "lost")
            for index, (turn, wanted) in enumerate(zip(turns, expected, strict=True))
        )
