"""Definition checks: eager shape checks and the graph check made at run start.

Every failure is a :class:`~pi_workflows.errors.WorkflowDefinitionError` whose one-line
message names the workflow, node or edge at fault (discovery adds the file).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .nodes import Node, fail

if TYPE_CHECKING:
    from .graph import Workflow

RESERVED_NAMES = frozenset({"answer", "cancel", "list", "pause", "resume", "status"})
NODE_ID_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
WORKFLOW_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RESERVED_NODE_PREFIX = "__piw_"
SWITCH_ROOTS = ("$.", "$output.", "$result.")
PATH_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")


def check_node_id(node_id: Any, what: str = "node id") -> None:
    if not isinstance(node_id, str) or not NODE_ID_PATTERN.match(node_id):
        raise fail(f"{what} {node_id!r} must match {NODE_ID_PATTERN.pattern}")
    if node_id.startswith(RESERVED_NODE_PREFIX):
        raise fail(f"{what} {node_id!r} must not start with {RESERVED_NODE_PREFIX!r}")


def check_edge(src: Any, dst: Any) -> None:
    check_node_id(src, "edge source")
    check_node_id(dst, f"edge {src!r} target")


def split_path(on: str) -> tuple[str, list[str]]:
    """`$output.a.b` → (`$output.`, [`a`, `b`]); the path must already be checked."""
    root = next(r for r in SWITCH_ROOTS if on.startswith(r))
    return root, on[len(root) :].split(".")


def check_switch(src: Any, on: Any, cases: Any) -> None:
    check_node_id(src, "switch source")
    where = f"switch from {src!r}"
    if not isinstance(on, str) or not on.startswith(SWITCH_ROOTS):
        raise fail(f"{where}: path {on!r} must start with $., $output. or $result.")
    _, keys = split_path(on)
    if not all(PATH_KEY_PATTERN.match(key) for key in keys):
        raise fail(f"{where}: path {on!r} must be dot-separated keys")
    if not isinstance(cases, Mapping) or not cases:
        raise fail(f"{where} on {on!r} needs a non-empty cases mapping")
    for value, target in cases.items():
        if not isinstance(value, str):
            raise fail(f"{where} on {on!r}: case {value!r} must be a string")
        check_node_id(target, f"{where} case {value!r} target")


def check_definition(
    name: Any,
    start_at: Any,
    nodes: Any,
    edges: Any,
    presentation_prompt: Any,
    max_steps: Any,
    input: Any,
) -> None:
    """The eager checks of `workflow(...)`."""
    from .graph import Edge, Switch

    if not isinstance(name, str) or not WORKFLOW_NAME_PATTERN.match(name):
        raise fail(f"workflow name {name!r} must match {WORKFLOW_NAME_PATTERN.pattern}")
    if name in RESERVED_NAMES:
        raise fail(
            f"workflow name {name!r} is reserved (reserved: {', '.join(sorted(RESERVED_NAMES))})"
        )
    where = f"workflow {name!r}"
    check_node_id(start_at, f"{where}: start_at")
    if not isinstance(nodes, Mapping) or not nodes:
        raise fail(f"{where}: nodes must be a non-empty mapping of id → node")
    for node_id, node in nodes.items():
        check_node_id(node_id, f"{where}: node id")
        if not isinstance(node, Node):
            raise fail(f"{where}: node {node_id!r} must be built with a node helper like compute()")
    if not isinstance(edges, (list, tuple)):
        raise fail(f"{where}: edges must be a list of edge(...) and switch(...)")
    for index, item in enumerate(edges):
        if not isinstance(item, (Edge, Switch)):
            raise fail(f"{where}: edges[{index}] must be edge(...) or switch(...), got {item!r}")
    if presentation_prompt is not None and not (
        isinstance(presentation_prompt, str) or callable(presentation_prompt)
    ):
        raise fail(f"{where}: presentation_prompt must be a string or a function")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps <= 0:
        raise fail(f"{where}: max_steps must be a positive integer, got {max_steps!r}")
    if input is not None and not callable(input):
        raise fail(f"{where}: input must be a function that normalises the run input")


def validate_graph(definition: Workflow) -> None:
    """The run-start checks: start, targets, one outgoing edge, reachability."""
    where = f"workflow {definition.name!r}"
    nodes = definition.nodes
    if definition.start_at not in nodes:
        raise fail(f"{where}: start_at {definition.start_at!r} is not a node")
    seen_sources: set[str] = set()
    for item in definition.edges:
        if item.src not in nodes:
            raise fail(f"{where}: {item.describe()} starts at unknown node {item.src!r}")
        if item.src in seen_sources:
            raise fail(f"{where}: node {item.src!r} has more than one outgoing edge")
        seen_sources.add(item.src)
        for target in item.targets:
            if target not in nodes:
                raise fail(f"{where}: {item.describe()} targets unknown node {target!r}")
    reachable = {definition.start_at}
    frontier = [definition.start_at]
    while frontier:
        outgoing = definition.outgoing(frontier.pop())
        for target in outgoing.targets if outgoing else ():
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    unreachable = [node_id for node_id in nodes if node_id not in reachable]
    if unreachable:
        raise fail(
            f"{where}: node {unreachable[0]!r} is not reachable from {definition.start_at!r}"
        )
