"""The text graph renderer, compared with snapshots in tests/view/snapshots/*.txt.

A layout change shows as a diff of those files: regenerate them with
PIW_UPDATE_SNAPSHOTS=1 and read the diff before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.view.graph import (
    GraphEdge,
    NodeProgress,
    RunProgress,
    WorkflowGraph,
    layout,
    render,
    render_text,
)
from pi_workflows.view.progress import entries_until_step, run_progress

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("PIW_UPDATE_SNAPSHOTS") == "1"


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / f"{name}.txt"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no snapshot {path.name}; run with PIW_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(encoding="utf-8"), f"{path.name} differs:\n{text}"
    assert max(len(line) for line in text.splitlines()) <= 80


def graph(name: str, nodes: dict[str, str], *edges: tuple[str, ...]) -> WorkflowGraph:
    return WorkflowGraph(
        name, next(iter(nodes)), tuple(nodes.items()), tuple(GraphEdge(*e) for e in edges)
    )


def attempts(*steps: tuple[str, str]) -> list[dict[str, Any]]:
    """Watch entries for (node, outcome) attempts in order; outcome "" leaves it running."""
    entries: list[dict[str, Any]] = []
    for number, (node, outcome) in enumerate(steps):
        attempt = f"{node}-{number}"
        at = 1000 * number
        entries.append({"kind": "nodeStarted", "at": at, "nodeId": node, "attemptId": attempt})
        if outcome:
            ended = {"kind": "nodeEnded", "at": at + 500, "nodeId": node, "attemptId": attempt}
            ended["outcome"] = outcome
            if outcome != "ok":
                ended["error"] = "exit status 2: tests failed in test_parser.py"
            entries.append(ended)
    return entries


CHAIN = graph(
    "chain",
    {"fetch": "action", "summarize": "agent", "publish": "notify"},
    ("fetch", "summarize"),
    ("summarize", "publish"),
)
BRANCH = graph(
    "branch",
    {"classify": "decision", "continue_lane": "agent", "checkpoint_lane": "checkpoint"},
    ("classify", "continue_lane", "continue"),
    ("classify", "checkpoint_lane", "checkpoint"),
)
SWITCH = graph(
    "triage",
    {
        "triage": "decision",
        "bug": "agent",
        "feature": "agent",
        "question": "agent",
        "reply": "notify",
    },
    ("triage", "bug", "bug"),
    ("triage", "feature", "feature"),
    ("triage", "question", "question"),
    ("bug", "reply"),
    ("feature", "reply"),
    ("question", "reply"),
)
LOOP = graph(
    "fix-until-green",
    {"plan": "agent", "fix": "agent", "test": "action", "report": "notify"},
    ("plan", "fix"),
    ("fix", "test"),
    ("test", "fix", "red"),
    ("test", "report", "green"),
)


def test_a_chain_draws_its_taken_links_heavy_and_the_running_node_with_its_time() -> None:
    progress = run_progress(
        CHAIN,
        attempts(("fetch", "ok"), ("summarize", "")),
        {"status": "running", "statusDetail": "reading 12 files"},
        now_ms=1000 + 75_000,
    )
    assert_snapshot("chain", render_text(CHAIN, progress))


def test_a_branch_marks_the_case_taken_and_leaves_the_other_pending() -> None:
    progress = run_progress(BRANCH, attempts(("classify", "ok"), ("continue_lane", "ok")))
    assert progress.taken == {("classify", "continue_lane")}
    assert_snapshot("branch", render_text(BRANCH, progress))


def test_a_switch_labels_each_case_and_ranks_the_join_below_them() -> None:
    plan = layout(SWITCH)
    assert plan.order == ("triage", "bug", "feature", "question", "reply")
    assert plan.rank["reply"] == 2
    progress = run_progress(SWITCH, attempts(("triage", "ok"), ("feature", "ok"), ("reply", "ok")))
    assert_snapshot("switch", render_text(SWITCH, progress))


def test_a_loop_is_routed_round_the_gutter_and_counts_the_attempts() -> None:
    steps = [("plan", "ok")] + [("fix", "ok"), ("test", "ok")] * 2 + [("fix", "")]
    progress = run_progress(LOOP, attempts(*steps), now_ms=5000 + 3_000)
    assert layout(LOOP).back_edges == {GraphEdge("test", "fix", "red")}
    assert progress.taken == {("plan", "fix"), ("fix", "test"), ("test", "fix")}
    assert progress.nodes["fix"].attempts == 3
    assert_snapshot("loop", render_text(LOOP, progress))


def test_a_failed_node_shows_its_error_cut_to_the_width() -> None:
    progress = run_progress(LOOP, attempts(("plan", "ok"), ("fix", "ok"), ("test", "failed")))
    text = render_text(LOOP, progress)
    assert "✗ test  action" in text
    assert_snapshot("failed", text)


def test_a_waiting_node_shows_what_it_waits_for() -> None:
    progress = run_progress(
        BRANCH,
        attempts(("classify", "ok"), ("checkpoint_lane", "ok")),
        {"status": "waiting", "statusDetail": "needs clarification"},
    )
    assert_snapshot("waiting", render_text(BRANCH, progress))


def test_a_node_run_three_times_is_marked_with_its_attempts() -> None:
    # A worker died twice inside summarize: no transition is taken by a restart.
    entries = attempts(("fetch", "ok"), ("summarize", ""), ("summarize", ""), ("summarize", "ok"))
    progress = run_progress(CHAIN, entries)
    assert progress.taken == {("fetch", "summarize")}
    assert_snapshot("attempts", render_text(CHAIN, progress))


def test_replay_after_step_k_is_the_render_of_the_entries_up_to_k() -> None:
    steps = [("plan", "ok")] + [("fix", "ok"), ("test", "ok")] * 2
    entries = attempts(*steps)
    after_two = run_progress(LOOP, entries_until_step(entries, 2))
    assert after_two.taken == {("plan", "fix")}
    assert after_two.nodes["fix"].status == "done"
    assert "test" not in after_two.nodes
    assert render_text(LOOP, after_two) != render_text(LOOP, run_progress(LOOP, entries))


def test_taken_columns_are_reported_for_a_styled_view() -> None:
    progress = RunProgress({"fetch": NodeProgress("done")}, {("fetch", "summarize")})
    lines = render(CHAIN, progress)
    stem = lines[1]
    assert stem.text == "┃" and stem.taken == ((0, 1),)
    assert all(not line.taken for line in lines[2:])


@pytest.mark.parametrize("width", [40, 80])
def test_details_are_cut_to_the_width(width: int) -> None:
    progress = RunProgress({"fetch": NodeProgress("running", 1, 1000, "x" * 200)})
    assert all(len(line.text) <= width for line in render(CHAIN, progress, width))


def test_nested_loops_cross_in_the_gutter_and_unreached_nodes_go_last() -> None:
    nested = graph(
        "nested",
        {"a": "agent", "orphan": "notify", "b": "agent", "c": "compute", "d": "compute"},
        ("a", "b"),
        ("b", "c"),
        ("c", "d"),
        ("d", "b", "again"),
        ("d", "c", "retry"),
        ("d", "d", "self"),
    )
    progress = run_progress(
        nested, attempts(("a", "ok"), ("b", "ok"), ("c", "ok"), ("d", "ok"), ("b", ""))
    )
    assert layout(nested).order == ("a", "b", "c", "d", "orphan")
    text = render_text(nested, progress)
    assert "┿" in text  # the taken outer loop crosses the inner one's line
    assert_snapshot("nested", text)


def test_pushed_entries_move_a_run_graph_answer_on_without_repeating_a_step() -> None:
    from pi_workflows.view.progress import with_entries

    answer = {
        "runId": "r",
        "steps": [{"attemptId": "a1", "nodeId": "plan", "outcome": "ok", "output": {"x": 1}}],
        "current": {"attemptId": "a2", "nodeId": "fix", "startedAt": 5},
    }
    pushed = [
        {"kind": "nodeStarted", "at": 1, "nodeId": "plan", "attemptId": "a1"},  # known
        {"kind": "nodeEnded", "at": 2, "nodeId": "plan", "attemptId": "a1", "outcome": "ok"},
        {
            "kind": "nodeEnded",
            "at": 9,
            "nodeId": "fix",
            "attemptId": "a2",
            "outcome": "failed",
            "error": "boom",
            "durationMs": 4,
        },
        {"kind": "nodeStarted", "at": 10, "nodeId": "test", "attemptId": "a3"},
    ]

    moved = with_entries(answer, pushed)

    assert [s["attemptId"] for s in moved["steps"]] == ["a1", "a2"]
    assert moved["steps"][0]["output"] == {"x": 1}  # the read one is kept whole
    assert moved["steps"][1] == {
        "attemptId": "a2",
        "nodeId": "fix",
        "outcome": "failed",
        "error": "boom",
        "durationMs": 4,
    }
    assert moved["current"] == {
        "attemptId": "a3",
        "nodeId": "test",
        "nodeType": None,
        "startedAt": 10,
    }
    assert answer["current"]["attemptId"] == "a2"  # the answer itself is left as it was
