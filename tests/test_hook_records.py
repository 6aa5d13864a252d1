"""The typed records say exactly what a running host hands to hooks, channels and executors.

One local plugin on a real host writes down the keys of every dict-shaped value it gets:
terminal facts (both hooks), a decision channel's request, resolution, delivery and
report_answer's result, and a headless agent executor's request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_type_hints

import pytest

from pi_workflows.records import (
    AgentStepRequest,
    AnswerResult,
    ChannelRequest,
    DecisionResolution,
    EarlierOutcome,
    StepContract,
    TerminalFacts,
)
from pi_workflows.testing import WorkflowHost, wait_until

RECORDING_PLUGIN = """
import json
import os
import threading
from pathlib import Path

from pi_workflows import hookimpl

OUT = Path(os.environ["RECORDS_OUT"])


def note(name, value):
    # write then rename: the test reads these files while the host is still running
    partial = OUT / f"{name}.json.partial"
    partial.write_text(json.dumps(value, sort_keys=True, default=str))
    os.replace(partial, OUT / f"{name}.json")


@hookimpl
def piw_presentation_instructions(run, facts):
    note("facts-for-instructions", sorted(facts))
    return None


@hookimpl
def piw_render_terminal_message(facts, instructions):
    note("facts-for-rendering", sorted(facts))
    return None


class RecordingChannel:
    def __init__(self, context):
        self.context = context

    def deliver(self, request):
        note("channel-request", sorted(request))
        note("choices", request["choices"])

        def answer():
            result = self.context.report_answer(request["decisionId"], "ship", actor="ops")
            note("answer-result", sorted(result))

        threading.Thread(target=answer).start()
        return {"messageId": "m-1"}

    def settle(self, request, resolution, delivery):
        note("resolution", sorted(resolution))
        note("delivery", delivery)
        return {}


@hookimpl
def piw_register_decision_channels(register):
    register("recording", RecordingChannel)


class RecordingExecutor:
    def run_agent_step(self, request, signal):
        note("executor-request", sorted(request))
        note("step-contract", sorted(request["contract"]))
        return {"output": {"done": True}}


@hookimpl
def piw_register_agent_executors(register):
    register("recording", RecordingExecutor)
"""

WORKFLOW = """
from pi_workflows import agent, choice, compute, edge, human_decision, text_input, workflow

WORKFLOW = workflow(
    name="records",
    start_at="work",
    nodes={
        "work": agent("Do the work."),
        "approve": human_decision(
            audience="ops",
            choices={
                "ship": choice("Ship"),
                "redo": choice("Redo", input=text_input("why", "Why?")),
            },
            request=lambda ctx: {
                "title": "Ship it?",
                "presentation": {"summary": "Done.", "blocks": []},
            },
        ),
        "finish": compute(lambda ctx: ctx.outputs["approve"]),
    },
    edges=[edge("work", "approve"), edge("approve", "finish")],
)
"""


def _keys(record: type) -> list[str]:
    return sorted(get_type_hints(record))


@pytest.mark.hook_effect("piw_presentation_instructions")
def test_records_name_every_key_a_running_host_hands_out(workflow_host: WorkflowHost):
    out = workflow_host.root / "records"
    out.mkdir()
    workflow_host.add_plugin("recording_plugin", RECORDING_PLUGIN)
    workflow_host.write_workflow("records", WORKFLOW)
    channels = workflow_host.config_dir / "channels.json"
    channels.write_text(
        json.dumps({"audiences": {"ops": ["recording"]}, "channels": {"recording": {}}})
    )
    channels.chmod(0o600)
    workflow_host.start(RECORDS_OUT=str(out), PI_WORKFLOWS_AGENT_EXECUTOR="recording")

    workflow_host.start_run("records")  # headless: the agent step goes to the executor
    workflow_host.start_run("hello", {"name": "Ada"}, session="chat-1")  # a terminal message
    noted = wait_until(lambda: _all_noted(out), what="every record noted", timeout=60)

    assert noted["executor-request"] == _keys(AgentStepRequest)
    assert noted["step-contract"] == _keys(StepContract)
    assert noted["channel-request"] == _keys(ChannelRequest)
    assert noted["choices"] == {
        "ship": {"label": "Ship"},
        "redo": {"label": "Redo", "input": {"name": "why", "prompt": "Why?"}},
    }
    assert noted["answer-result"] == _keys(AnswerResult)
    assert noted["resolution"] == _keys(DecisionResolution)
    assert noted["delivery"] == {"messageId": "m-1"}
    without_fingerprint = sorted(set(_keys(TerminalFacts)) - {"terminalFingerprint"})
    assert noted["facts-for-instructions"] == without_fingerprint
    assert noted["facts-for-rendering"] == _keys(TerminalFacts)
    assert "terminalFingerprint" in TerminalFacts.__optional_keys__
    assert _keys(EarlierOutcome) == ["error", "finalOutput", "reason", "runId", "status"]


NOTES = (
    "executor-request",
    "step-contract",
    "channel-request",
    "choices",
    "answer-result",
    "resolution",
    "delivery",
    "facts-for-instructions",
    "facts-for-rendering",
)


def _all_noted(out: Path) -> dict | None:
    if not all((out / f"{name}.json").exists() for name in NOTES):
        return None
    return {name: json.loads((out / f"{name}.json").read_text()) for name in NOTES}
