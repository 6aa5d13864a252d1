"""Edges, switches and the workflow definition itself (SPEC §12, engine.md §1.1 and §1.5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..canonical import digest
from .nodes import Node
from .validate import check_definition, check_edge, check_switch

DEFINITION_SNAPSHOT_SCHEMA = "pi-workflows.definition-snapshot.v1"
DEFAULT_MAX_STEPS = 100


@dataclass(frozen=True)
class Edge:
    """An unconditional transition taken when `src` succeeds."""

    src: str
    dst: str

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.dst,)

    def describe(self) -> str:
        return f"edge {self.src!r} -> {self.dst!r}"

    def snapshot(self) -> dict[str, Any]:
        return {"from": self.src, "to": self.dst}


@dataclass(frozen=True)
class Switch:
    """A transition chosen by the string form of the value at path `on`."""

    src: str
    on: str
    cases: Mapping[str, str]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.cases.values())

    @property
    def routes_failures(self) -> bool:
        """Only switches on the result record see failed and timed-out attempts."""
        return self.on.startswith("$result.")

    def describe(self) -> str:
        return f"switch from {self.src!r} on {self.on!r}"

    def snapshot(self) -> dict[str, Any]:
        return {"from": self.src, "switch": {"on": self.on, "cases": dict(self.cases)}}


def edge(src: str, dst: str) -> Edge:
    """`src` → `dst` when `src` succeeds."""
    check_edge(src, dst)
    return Edge(src, dst)


def switch(src: str, on: str, cases: Mapping[str, str]) -> Switch:
    """Route from `src` by the value at `on` (`$.x`, `$output.x` or `$result.outcome`)."""
    check_switch(src, on, cases)
    return Switch(src, on, dict(cases))


@dataclass(frozen=True)
class Workflow:
    """A validated workflow definition, as `workflow(...)` returns it."""

    name: str
    start_at: str
    nodes: Mapping[str, Node]
    edges: tuple[Edge | Switch, ...]
    presentation_prompt: str | Callable[[Any], str | None] | None = None
    max_steps: int = DEFAULT_MAX_STEPS
    input: Callable[[Any], Any] | None = None

    def outgoing(self, node_id: str) -> Edge | Switch | None:
        for candidate in self.edges:
            if candidate.src == node_id:
                return candidate
        return None

    def snapshot(self) -> dict[str, Any]:
        """The canonical definition snapshot (functions omitted): what the digest covers."""
        return {
            "schema": DEFINITION_SNAPSHOT_SCHEMA,
            "name": self.name,
            "startAt": self.start_at,
            "maxSteps": self.max_steps,
            "nodes": {node_id: node.snapshot() for node_id, node in self.nodes.items()},
            "edges": [e.snapshot() for e in self.edges],
            "presentationPrompt": (
                self.presentation_prompt if isinstance(self.presentation_prompt, str) else None
            ),
        }

    @property
    def definition_digest(self) -> str:
        return digest(self.snapshot())


def workflow(
    name: str,
    start_at: str,
    nodes: Mapping[str, Node],
    edges: list[Edge | Switch] | tuple[Edge | Switch, ...],
    presentation_prompt: str | Callable[[Any], str | None] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    input: Callable[[Any], Any] | None = None,
) -> Workflow:
    """Define a workflow; shapes are checked now, the graph when a run starts."""
    check_definition(name, start_at, nodes, edges, presentation_prompt, max_steps, input)
    return Workflow(
        name=name,
        start_at=start_at,
        nodes=dict(nodes),
        edges=tuple(edges),
        presentation_prompt=presentation_prompt,
        max_steps=max_steps,
        input=input,
    )
