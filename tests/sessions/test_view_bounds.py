"""A session view stays under the 1 MiB protocol frame however much a session holds (11.13)."""

from __future__ import annotations

import json
import socket

import pytest

from pi_workflows.bounded_values import truncation_marker
from pi_workflows.canonical import canonical_json
from pi_workflows.host.session_views import MAX_VIEW_MESSAGES, PROMPT_MARKER
from tests.host.conftest import request_frame

# COUNT notifications of SIZE characters each, then a 300 KiB result.
CHATTY = """
from pi_workflows import compute, edge, notify, workflow

COUNT = {count}
nodes = {{
    f"tell{{i}}": notify(lambda ctx, i=i: f"note {{i}} " + "n" * {size}) for i in range(COUNT)
}}
nodes["finish"] = compute(lambda ctx: {{"rows": ["x" * 100] * 3000}})
WORKFLOW = workflow(
    name="chatty",
    start_at="tell0",
    nodes=nodes,
    edges=[edge(f"tell{{i}}", f"tell{{i + 1}}") for i in range(COUNT - 1)]
    + [edge(f"tell{{COUNT - 1}}", "finish")],
)
"""


@pytest.mark.scenario("11.13", "6.4")
def test_a_view_shows_a_bounded_window_of_messages_and_cuts_the_result(sessions, harness):
    # 1.3 MB of messages in 20 nodes: a run of 80 smaller ones took over 30 s on
    # PostgreSQL on a loaded 2-core machine, with nothing more to show.
    harness.write_workflow("chatty", CHATTY.format(count=20, size=64_000))
    run_id = sessions.start("chatty", "session-chatty")
    harness.wait_for_status(run_id, "completed")
    session = sessions.open("session-chatty", coordinator=False)
    view = session.wait_for(lambda v: v["run"] is not None and v["run"]["runId"] == run_id)

    assert len(canonical_json(view).encode()) < 1024 * 1024
    messages = view["workflowMessages"]
    assert view["workflowMessageTotal"] == 21  # 20 notifications and the terminal message
    # Fewer than the count cap: the view's byte cap cut the window.
    assert 0 < len(messages) < 21 < MAX_VIEW_MESSAGES
    assert view["workflowMessagesOmitted"] == 21 - len(messages)
    # The newest messages are kept, in order; the next one to send is always there.
    assert messages[-1]["kind"] == "terminal"
    assert messages[-2]["content"].startswith("note 19 ")
    orders = [m["order"] for m in messages]
    assert orders == sorted(orders)
    assert view["nextWorkflowMessageId"] in {m["workflowMessageId"] for m in messages}
    assert view["run"]["finalOutput"].endswith(truncation_marker("result"))

    listed = harness.cli("session", "messages", "session-chatty").stdout.splitlines()
    assert listed[0] == f"({view['workflowMessagesOmitted']} older messages not shown)"
    assert len(listed) == 1 + len(messages)


# An agent step whose prompt quotes a 470 KB earlier result.
BIG_PROMPT = """
from pi_workflows import agent, compute, edge, workflow

WORKFLOW = workflow(
    name="big-prompt",
    start_at="make",
    nodes={
        "make": compute(lambda ctx: {"rows": ["x" * 100] * 4500}),
        "ask": agent(lambda ctx: "Summarise these rows: " + str(ctx.outputs["make"]["rows"])),
    },
    edges=[edge("make", "ask")],
)
"""


@pytest.mark.scenario("11.13")
def test_a_step_with_a_huge_prompt_still_fits_its_view(sessions, harness):
    run_id, session, step = sessions.first_step("big-prompt", BIG_PROMPT, "session-prompt")

    assert step["content"].startswith("Summarise these rows: ['xxx")  # the whole prompt
    assert len(step["content"]) > 450_000
    (pending,) = session.view["pendingInteractions"]
    assert pending["prompt"].endswith(PROMPT_MARKER)  # the step message has it whole
    assert len(canonical_json(session.view).encode()) < 600 * 1024  # not the prompt twice
    assert session.submit(step, {"summary": "many x"}).outcome == "accepted"


def test_a_prompt_over_the_limit_fails_its_step_with_the_reason(sessions, harness):
    harness.write_workflow(
        "huge-prompt",
        BIG_PROMPT.replace(
            'str(ctx.outputs["make"]["rows"])', 'str(ctx.outputs["make"]["rows"]) * 3'
        ).replace('name="big-prompt"', 'name="huge-prompt"'),
    )
    run_id = sessions.start("huge-prompt", "session-huge")

    status = harness.wait_for_status(run_id, "failed")
    assert "The prompt of node 'ask' is 1.3 MiB; the limit is 512 KiB" in status["error"]
    session = sessions.open("session-huge", coordinator=False)
    view = session.wait_for(lambda v: v["workflowMessages"], what="the terminal message")
    assert [m["kind"] for m in view["workflowMessages"]] == ["terminal"]


@pytest.mark.scenario("1.13")
def test_a_viewer_that_reads_slowly_gets_the_latest_view_not_every_one(sessions, harness):
    harness.write_workflow("chatty", CHATTY.format(count=40, size=4_000))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.settimeout(30)
        slow.connect(str(harness.home.socket_path))
        reader = slow.makefile("rb")
        assert json.loads(reader.readline())["type"] == "hello"
        watch = {"subscriptionId": "slow", "sessionId": "session-slow", "coordinator": False}
        slow.sendall(request_frame("watch", "view.session.watch", watch))
        assert json.loads(reader.readline())["outcome"] == "accepted"

        # The viewer reads nothing while 40 notifications and the result change its view.
        run_id = sessions.start("chatty", "session-slow")
        harness.wait_for_status(run_id, "completed", timeout=60)

        snapshots = []
        while not snapshots or snapshots[-1]["payload"]["workflowMessageTotal"] < 41:
            frame = json.loads(reader.readline())
            if frame.get("event") == "session_snapshot":
                snapshots.append(frame)
    revisions = [snapshot["revision"] for snapshot in snapshots]
    assert revisions == sorted(revisions)
    # Dozens of views were published (each revision one); the slow viewer was written a
    # few of them, the last one whole, instead of every one.
    assert revisions[-1] > 20 and len(snapshots) < revisions[-1] / 2, revisions
    final = snapshots[-1]["payload"]
    assert final["workflowMessages"][-1]["kind"] == "terminal"
