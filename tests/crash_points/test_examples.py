"""Every built-in example workflow survives a SIGKILL of its worker, and of its host, at
its durable boundaries (the test kit's crash-point explorer): by default at the first
boundary of each kind, with --crash-points=full at every one."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from pi_workflows.testing import WorkflowHost
from pi_workflows.testing.crash_points import SESSION, CrashCase, channel_effects


def answer_checkpoint(host: WorkflowHost, run: dict[str, Any]) -> None:
    client = host.client()
    try:
        client.answer_checkpoint(run["runId"], {"clarified": "yes"})
    finally:
        client.close()


def answer_decision(host: WorkflowHost, run: dict[str, Any]) -> None:
    client = host.client()
    try:
        for pending in client.list_decisions():
            if pending["runId"] == run["runId"]:
                client.answer_decision(pending["decisionId"], "continue")
    finally:
        client.close()


def settle_builtin_channels(host: WorkflowHost) -> None:
    """The operator's part for the built-in channels a killed host left in doubt: the cli
    channel's records are the host's own, so they happened; a session delivery happened if
    the session holds the decision's message, else it is retried."""
    client = host.client()
    try:
        doubtful = [
            effect
            for effect in client.list_effects(status="ambiguous")
            if effect["scope"] == "channel"
        ]
        if not doubtful:
            return
        shown = json.dumps(host.session_messages(SESSION))
        for effect in doubtful:
            happened = effect["channel"] == "cli" or effect["decisionId"] in shown
            if happened:
                client.confirm_effect(effect["effectId"])
            else:
                client.retry_effect(effect["effectId"])
    finally:
        client.close()


def applied_effects(host: WorkflowHost) -> Counter[str]:
    """The effects the host's ledger holds as applied, by node (a printf leaves no trace of
    its own to count)."""
    client = host.client()
    try:
        return Counter(
            effect["nodeId"] for effect in client.list_effects() if effect["status"] == "applied"
        )
    finally:
        client.close()


CASES = {
    "hello": CrashCase("hello", {"name": "Ada"}),
    "shell": CrashCase("shell", {"text": "once"}, effects=applied_effects),
    "echo": CrashCase("echo", {"task": "say hi"}, agent_replies={"reply": {"reply": "hi"}}),
    "branch": CrashCase(
        "branch",
        {"task": "unclear"},
        agent_replies={"classify": {"route": "checkpoint", "reason": "vague"}},
        answer=answer_checkpoint,
    ),
    "two-turn": CrashCase(
        "two-turn",
        agent_replies={
            "inspect": {"findings": ["a"], "repoSummary": "r"},
            "draft": {"draft": "d"},
            "checklist": {"checklist": ["c"], "references": ["README.md"]},
        },
    ),
    "human-decision": CrashCase(
        "human-decision",
        answer=answer_decision,
        resolve=settle_builtin_channels,
        effects=channel_effects,
    ),
}
# Host kills by default on this one: its boundaries are of every kind hello's are, and of
# an idempotent effect's; every example's with --crash-points=full.
HOST_KILLS_IN_CI = ("shell",)


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_example_workflow_survives_a_kill_at_its_boundaries(name: str, crash_points) -> None:
    targets = ("worker", "host") if crash_points.full or name in HOST_KILLS_IN_CI else ("worker",)

    report = crash_points.explore(CASES[name], targets=targets)

    print(report.summary())
    assert report.boundaries and report.kills
    # Every kind of boundary there is something to kill at was tried, by default too.
    killable = {b.kind for b in report.boundaries if b.has_worker or "host" in targets}
    assert {trial.boundary.kind for trial in report.trials} == killable
    report.assert_clean()
