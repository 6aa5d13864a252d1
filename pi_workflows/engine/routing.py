"""Choosing the next node (engine.md §1.5): plain edges, switches and failure routes."""

from __future__ import annotations

from typing import Any

from ..authoring import Switch, Workflow
from ..authoring.validate import split_path
from ..errors import PiWorkflowsError


class RoutingError(PiWorkflowsError):
    """A switch could not choose: missing value, non-scalar value or no matching case."""


def _case_key(value: Any) -> str:
    # Mirror the string form the reference engine looks cases up by.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def resolve_path(on: str, output: Any, result: dict[str, Any]) -> Any:
    root, keys = split_path(on)
    value: Any = result if root == "$result." else output
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise RoutingError(f"switch path {on} has no value")
        value = value[key]
    return value


def _switch_target(node_id: str, route: Switch, output: Any, result: dict[str, Any]) -> str:
    try:
        value = resolve_path(route.on, output, result)
    except RoutingError as error:
        raise RoutingError(f"Node {node_id!r}: {error}") from None
    if isinstance(value, (dict, list)) or value is None:
        raise RoutingError(
            f"Node {node_id!r}: switch on {route.on} needs a string, number or boolean, "
            f"got {type(value).__name__}"
        )
    key = _case_key(value)
    if key not in route.cases:
        raise RoutingError(f"Node {node_id!r}: switch on {route.on} has no case for {key!r}")
    return route.cases[key]


def next_node(definition: Workflow, node_id: str, result: dict[str, Any]) -> str | None:
    """The node after a successful attempt; None ends the run."""
    route = definition.outgoing(node_id)
    if route is None:
        return None
    if isinstance(route, Switch):
        return _switch_target(node_id, route, result.get("output"), result)
    return route.dst


def failure_route(definition: Workflow, node_id: str, result: dict[str, Any]) -> str | None:
    """The node a failed or timed-out attempt routes to; only `$result.` switches apply."""
    route = definition.outgoing(node_id)
    if not isinstance(route, Switch) or not route.routes_failures:
        return None
    return next_node(definition, node_id, result)
