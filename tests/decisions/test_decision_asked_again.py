"""A worker killed right after its attempt requested a human decision: the node runs
again and asks anew, and only the new request may be answered or time out.

Found by the model test's soak: the earlier attempt's decision stayed pending, its
deadline's default was accepted, and its continuation was refused by every worker ("does
not belong to checkpoint") — the run crash-looped instead of continuing.
"""

from __future__ import annotations

import pytest

from pi_workflows.testing.crash_points import CrashCase, CrashPoints

TIMED_DECISION = """
from pi_workflows import choice, compute, edge, human_decision, switch, workflow

WORKFLOW = workflow(name="timed-decision", start_at="propose",
    nodes={"propose": compute(lambda ctx: {"plan": "ship it"}),
           "approve": human_decision(
               audience="operator",
               choices={"ship": choice("Ship"), "stop": choice("Stop")},
               request=lambda ctx: {"title": "Ship?", "subject": ctx.outputs["propose"],
                                    "presentation": {"summary": "ready", "blocks": []}},
               on_timeout={"after_ms": 1000, "response": {"choice": "stop"}}),
           "shipped": compute(lambda ctx: {"shipped": True}),
           "stopped": compute(lambda ctx: {"shipped": False})},
    edges=[edge("propose", "approve"),
           switch("approve", on="$.choice", cases={"ship": "shipped", "stop": "stopped"})])
"""


@pytest.mark.integration
def test_a_decision_asked_again_after_a_worker_kill_times_out_once_and_continues(
    crash_points: CrashPoints,
):
    case = CrashCase(
        "timed-decision",
        prepare=lambda host: host.write_workflow("timed-decision", TIMED_DECISION),
    )

    report = crash_points.explore(
        case,
        targets=("worker",),
        where=lambda boundary: "human_decision.requested" in boundary.events.values(),
    )

    assert report.kills >= 1 and not report.failures, report.summary()
