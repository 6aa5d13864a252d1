"""Routing: plain edges, switches on $. / $output. / $result., failures, max_steps."""

from __future__ import annotations

import threading

from pi_workflows import compute, edge, switch, workflow


def boom(ctx):
    raise RuntimeError("boom")


def test_switch_on_output_and_dollar_paths(runs) -> None:
    def build(on: str):
        return workflow(
            "route",
            "pick",
            {
                "pick": compute(lambda ctx: {"lane": {"name": ctx.input["lane"]}, "n": 2}),
                "a": compute(lambda ctx: "A"),
                "b": compute(lambda ctx: "B"),
            },
            [switch("pick", on=on, cases={"a": "a", "b": "b"})],
        )

    assert runs.start(build("$.lane.name"), {"lane": "a"})["finalOutput"] == "A"
    assert runs.start(build("$output.lane.name"), {"lane": "b"})["finalOutput"] == "B"


def test_numbers_and_booleans_match_their_string_form(runs) -> None:
    definition = workflow(
        "scalars",
        "pick",
        {
            "pick": compute(lambda ctx: {"n": 2.0, "ok": True}),
            "two": compute(lambda ctx: ctx.outputs["pick"]),
            "yes": compute(lambda ctx: "yes"),
        },
        [
            switch("pick", on="$.n", cases={"2": "two"}),
            switch("two", on="$.ok", cases={"true": "yes"}),
        ],
    )
    assert runs.start(definition)["finalOutput"] == "yes"


def test_a_missing_path_value_fails_the_run(runs) -> None:
    definition = workflow(
        "nopath",
        "pick",
        {"pick": compute(lambda ctx: True), "a": compute(lambda ctx: 1)},
        [switch("pick", on="$.ok", cases={"true": "a"})],
    )
    outcome = runs.start(definition)
    assert outcome["status"] == "failed"
    assert outcome["error"] == "Node 'pick': switch path $.ok has no value"


def test_missing_case_fails_the_run(runs) -> None:
    definition = workflow(
        "missing",
        "pick",
        {"pick": compute(lambda ctx: {"route": "nowhere"}), "a": compute(lambda ctx: 1)},
        [switch("pick", on="$.route", cases={"a": "a"})],
    )
    outcome = runs.start(definition)
    assert outcome["status"] == "failed"
    assert outcome["error"] == "Node 'pick': switch on $.route has no case for 'nowhere'"


def test_failures_route_only_through_result_switches(runs) -> None:
    plain = workflow(
        "plain",
        "bad",
        {"bad": compute(boom), "after": compute(lambda ctx: 1)},
        [edge("bad", "after")],
    )
    outcome = runs.start(plain)
    assert outcome["status"] == "failed"
    assert outcome["error"] == "Node 'bad' failed: RuntimeError: boom"

    output_switch = workflow(
        "out",
        "bad",
        {"bad": compute(boom), "after": compute(lambda ctx: 1)},
        [switch("bad", on="$.outcome", cases={"failed": "after"})],
    )
    assert runs.start(output_switch)["status"] == "failed"

    routed = workflow(
        "routed",
        "bad",
        {
            "bad": compute(boom),
            "recover": compute(lambda ctx: {"saw": ctx.results["bad"]["error"]}),
        },
        [switch("bad", on="$result.outcome", cases={"failed": "recover"})],
    )
    assert runs.start(routed)["finalOutput"] == {"saw": "RuntimeError: boom"}


def test_timeout_ends_the_node_timed_out_and_can_be_routed(runs) -> None:
    def slow(ctx):
        ctx.signal.wait(30)
        return "late"

    unrouted = workflow("slow", "wait", {"wait": compute(slow, timeout_ms=100)}, [])
    outcome = runs.start(unrouted)
    assert outcome["status"] == "timed_out"
    assert outcome["error"] == "Node 'wait' timed out: Node 'wait' timed out after 100 ms"
    step = runs.state(outcome["runId"])["steps"][0]
    assert step["outcome"] == "timed_out" and step["output"] is None

    routed = workflow(
        "slow",
        "wait",
        {"wait": compute(slow, timeout_ms=100), "fallback": compute(lambda ctx: "fallback")},
        [switch("wait", on="$result.outcome", cases={"timed_out": "fallback"})],
    )
    assert runs.start(routed)["finalOutput"] == "fallback"


def test_a_node_stuck_past_its_timeout_does_not_hold_up_the_next(runs) -> None:
    # A node ignoring its abort signal keeps its thread; the next node gets another one.
    returned, release = threading.Event(), threading.Event()

    def stuck(ctx):
        release.wait(30)
        returned.set()

    routed = workflow(
        "stuck",
        "wait",
        {
            "wait": compute(stuck, timeout_ms=100),
            "fallback": compute(lambda ctx: {"stuckStillRunning": not returned.is_set()}),
        },
        [switch("wait", on="$result.outcome", cases={"timed_out": "fallback"})],
    )
    try:
        assert runs.start(routed)["finalOutput"] == {"stuckStillRunning": True}
    finally:
        release.set()


def test_max_steps_bounds_loops(runs) -> None:
    loop = workflow(
        "loop",
        "spin",
        {"spin": compute(lambda ctx: {"again": True})},
        [switch("spin", on="$.again", cases={"true": "spin"})],
        max_steps=5,
    )
    outcome = runs.start(loop)
    assert outcome["status"] == "failed"
    assert outcome["error"] == "Workflow 'loop' exceeded max_steps (5) before node 'spin'"
    assert len(runs.state(outcome["runId"])["steps"]) == 5


def test_a_later_failed_attempt_removes_the_earlier_output(runs) -> None:
    def flaky(ctx):
        if "work" in ctx.outputs:
            raise ValueError("second time fails")
        return {"first": True}

    definition = workflow(
        "flaky",
        "work",
        {
            "work": compute(flaky),
            "observe": compute(lambda ctx: {"outputs": sorted(ctx.outputs)}),
        },
        [switch("work", on="$result.outcome", cases={"ok": "work", "failed": "observe"})],
    )
    outcome = runs.start(definition)
    assert outcome["finalOutput"] == {"outputs": []}
    state = runs.state(outcome["runId"])
    assert "work" not in state["outputs"]
    assert state["results"]["work"]["outcome"] == "failed"
    assert [s["outcome"] for s in state["steps"]] == ["ok", "failed", "ok"]


def test_invalid_graph_or_input_fails_at_run_start(runs) -> None:
    unreachable = workflow("g", "a", {"a": compute(lambda ctx: 1), "b": compute(lambda ctx: 2)}, [])
    outcome = runs.start(unreachable)
    assert outcome["status"] == "failed" and "node 'b' is not reachable" in outcome["error"]

    def only_dicts(value):
        if not isinstance(value, dict):
            raise ValueError("input must be an object")
        return value

    picky = workflow("p", "a", {"a": compute(lambda ctx: ctx.input)}, [], input=only_dicts)
    refused = runs.start(picky, "text")
    assert (
        refused["error"] == "Workflow 'p' rejected its input: ValueError: input must be an object"
    )
    assert runs.start(picky, {"k": 1})["finalOutput"] == {"k": 1}
