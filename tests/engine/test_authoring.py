"""Eager definition checks and the graph check at run start: one line naming the culprit."""

from __future__ import annotations

import pytest

from pi_workflows import (
    action,
    agent,
    checkpoint,
    choice,
    compute,
    decision,
    edge,
    human_decision,
    idempotent_effect,
    notify,
    route,
    shell,
    switch,
    text_input,
    workflow,
)
from pi_workflows.authoring import validate_graph
from pi_workflows.errors import WorkflowDefinitionError


def noop(ctx):
    return None


@pytest.mark.parametrize("name", ["answer", "cancel", "list", "pause", "resume", "status"])
def test_reserved_workflow_names_are_refused(name: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=f"'{name}' is reserved"):
        workflow(name, "a", {"a": compute(noop)}, [])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: workflow("w", "a", {"1bad": compute(noop)}, []), "node id '1bad'"),
        (lambda: workflow("w", "a", {"__piw_x": compute(noop)}, []), "must not start"),
        (lambda: workflow("w", "a", {}, []), "non-empty mapping"),
        (lambda: workflow("w", "a", {"a": noop}, []), "node 'a' must be built"),
        (lambda: workflow("w", "a", {"a": compute(noop)}, [("a", "b")]), r"edges\[0\]"),
        (lambda: workflow("w", "a", {"a": compute(noop)}, [], max_steps=0), "max_steps"),
        (lambda: edge("a", "b c"), "edge 'a' target"),
        (lambda: switch("a", on="route", cases={"x": "b"}), r"must start with \$\."),
        (lambda: switch("a", on="$.a..b", cases={"x": "b"}), "dot-separated keys"),
        (lambda: switch("a", on="$.route", cases={}), "non-empty cases"),
        (lambda: compute("not a function"), "compute run must be a function"),
        (lambda: action(noop, effect=None), "must declare effect"),
        (lambda: shell(lambda ctx: {"command": "true"}), "shell must declare effect"),
        (lambda: notify("hi", kind="loud"), "notify kind"),
        (lambda: agent(noop, timeout_ms=0), "timeout_ms must be a positive integer"),
        (lambda: route("q", choices=[]), "non-empty list"),
        (lambda: route("q", choices=["a", "a"]), "unique"),
        (lambda: text_input("two words", "?"), "simple identifier"),
        (
            lambda: human_decision(
                "operator",
                {"go": choice("Go")},
                noop,
                on_timeout={"after_ms": 5, "response": {"choice": "stop"}},
            ),
            "must pick one of the choices",
        ),
    ],
)
def test_eager_checks_name_the_problem(build, message: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=message) as raised:
        build()
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("nodes", "edges", "start", "message"),
    [
        ({"a": compute(noop)}, [], "missing", "start_at 'missing' is not a node"),
        ({"a": compute(noop)}, [edge("a", "b")], "a", "edge 'a' -> 'b' targets unknown node 'b'"),
        ({"a": compute(noop)}, [edge("z", "a")], "a", "starts at unknown node 'z'"),
        (
            {"a": compute(noop), "b": compute(noop), "c": compute(noop)},
            [edge("a", "b"), edge("a", "c")],
            "a",
            "node 'a' has more than one outgoing edge",
        ),
        (
            {"a": compute(noop), "b": compute(noop)},
            [switch("a", on="$.x", cases={"1": "a", "2": "nope"})],
            "a",
            "switch from 'a' on '\\$.x' targets unknown node 'nope'",
        ),
        ({"a": compute(noop), "b": compute(noop)}, [], "a", "node 'b' is not reachable"),
    ],
)
def test_graph_checks_at_run_start(nodes, edges, start: str, message: str) -> None:
    definition = workflow("graph", start, nodes, edges)
    with pytest.raises(WorkflowDefinitionError, match=message):
        validate_graph(definition)


def test_snapshot_omits_functions_and_digest_is_stable() -> None:
    def build(summary: str):
        return workflow(
            "snap",
            "a",
            {
                "a": shell(lambda ctx: {"command": "true"}, effect=idempotent_effect("t")),
                "b": checkpoint(summary=summary),
            },
            [edge("a", "b")],
        )

    first, again, other = build("one"), build("one"), build("two")
    snapshot = first.snapshot()
    assert snapshot["nodes"]["a"] == {
        "nodeType": "action",
        "timeoutMs": 15 * 60 * 1000,
        "actionExecution": "shell",
        "effect": {"policy": "idempotent", "type": "t"},
    }
    assert first.definition_digest == again.definition_digest != other.definition_digest


def test_decision_is_the_old_name_of_route_and_says_so() -> None:
    # "decision" means a human decision; the agent's routing step is route() now.
    with pytest.warns(DeprecationWarning, match=r"decision\(\) is now route\(\)"):
        old = decision("Which way?", ["left", "right"], "way", timeout_ms=5_000)
    new = route("Which way?", ["left", "right"], "way", timeout_ms=5_000)

    assert old.snapshot() == new.snapshot()
    assert old.snapshot()["decision"] == {"field": "way", "choices": ["left", "right"]}
    assert new.prompt is not None and not isinstance(new.prompt, str)
    assert new.prompt(None) == old.prompt(None)
