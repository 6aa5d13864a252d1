"""A workflow's graph as lines of text, with a run's progress drawn on it (issue 25).

The layout is layered and computed here rather than with a layout library: a DFS from
`startAt` (edges in definition order) marks the edges that close a cycle as back edges;
every node's rank is its longest path from the start over the remaining, forward edges.
Nodes are listed one to a row by rank (definition order within a rank), each followed
by its outgoing transitions; back edges are routed up a left gutter to the node they
return to. A library such as grandalf places nodes in 2-D coordinates for a canvas and
leaves drawing to the caller, which is most of the work on a terminal — and a column
list stays readable in 80 columns however wide the graph is.

Taken transitions are drawn with heavy line glyphs (`┃ ━ ┣`), so plain text shows
them, and their columns are listed in `GraphLine.taken` for a styled view to bold.
The renderer is a pure function: replaying a run "as it was after step K" is the same
call given the progress at step K (`pi_workflows.view.progress`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GLYPHS = {"done": "✓", "failed": "✗", "running": "◐", "waiting": "⏸", "pending": "·"}
ARROW = "▶"
DEFAULT_WIDTH = 80


@dataclass(frozen=True)
class GraphEdge:
    """One transition: `label` is the switch case that takes it (None: a plain edge)."""

    src: str
    dst: str
    label: str | None = None


@dataclass(frozen=True)
class WorkflowGraph:
    """What the renderer needs of a definition: node ids and types, and the transitions."""

    name: str
    start_at: str
    # (node id, node kind), in definition order: its type, or "decision" for an agent that
    # decides and "human decision" for a checkpoint that asks a person to choose
    nodes: tuple[tuple[str, str], ...]
    edges: tuple[GraphEdge, ...]

    @classmethod
    def from_snapshot(cls, snapshot: Mapping[str, Any]) -> WorkflowGraph:
        """From a definition snapshot (`Workflow.snapshot()`, what a run records)."""
        edges: list[GraphEdge] = []
        for entry in snapshot["edges"]:
            if "switch" in entry:
                for case, dst in entry["switch"]["cases"].items():
                    edges.append(GraphEdge(entry["from"], dst, case))
            else:
                edges.append(GraphEdge(entry["from"], entry["to"]))
        nodes = tuple((node_id, _node_kind(node)) for node_id, node in snapshot["nodes"].items())
        return cls(snapshot["name"], snapshot["startAt"], nodes, tuple(edges))

    def outgoing(self, node_id: str) -> list[GraphEdge]:
        return [e for e in self.edges if e.src == node_id]


def _node_kind(node: Mapping[str, Any]) -> str:
    if "decision" in node:
        return "decision"
    if "humanDecision" in node:
        return "human decision"
    return node["nodeType"]


@dataclass
class NodeProgress:
    """One node's state in a run: `status` is a key of GLYPHS."""

    status: str = "pending"
    attempts: int = 0
    elapsed_ms: int | None = None  # the running node's time so far
    detail: str | None = None  # status detail, checkpoint summary or error


@dataclass
class RunProgress:
    """A run's state as the graph shows it; nodes missing from `nodes` are pending."""

    nodes: dict[str, NodeProgress] = field(default_factory=dict)
    taken: set[tuple[str, str]] = field(default_factory=set)  # (src, dst) transitions taken

    def node(self, node_id: str) -> NodeProgress:
        return self.nodes.get(node_id) or NodeProgress()


@dataclass(frozen=True)
class GraphLine:
    """One line of the drawing; `taken` holds [start, end) columns of taken transitions."""

    text: str
    node_id: str | None = None  # the node this line shows, on node lines
    taken: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Layout:
    order: tuple[str, ...]  # nodes, by rank then definition order
    rank: Mapping[str, int]
    back_edges: frozenset[GraphEdge]


def layout(graph: WorkflowGraph) -> Layout:
    """Ranks (longest path from the start over forward edges) and the back edges."""
    ids = [node_id for node_id, _ in graph.nodes]
    back: set[GraphEdge] = set()
    state: dict[str, str] = {}  # "open" while on the DFS stack, then "done"

    def walk(root: str) -> None:
        state[root] = "open"
        stack = [(root, iter(graph.outgoing(root)))]
        while stack:
            node, edges = stack[-1]
            step = next(edges, None)
            if step is None:
                state[node] = "done"
                stack.pop()
            elif state.get(step.dst) == "open":
                back.add(step)
            elif step.dst not in state:
                state[step.dst] = "open"
                stack.append((step.dst, iter(graph.outgoing(step.dst))))

    walk(graph.start_at)
    reachable = set(state)
    for node_id in ids:
        if node_id not in state:
            walk(node_id)
    forward = [e for e in graph.edges if e not in back]
    rank = dict.fromkeys(ids, 0)
    indegree = dict.fromkeys(ids, 0)
    for e in forward:
        indegree[e.dst] += 1
    ready = [node_id for node_id in ids if indegree[node_id] == 0]
    while ready:
        node = ready.pop(0)
        for e in forward:
            if e.src == node:
                rank[e.dst] = max(rank[e.dst], rank[node] + 1)
                indegree[e.dst] -= 1
                if indegree[e.dst] == 0:
                    ready.append(e.dst)
    # Nodes the start never reaches go last, below everything it does reach.
    below = max(rank.values(), default=0) + 1
    for node_id in ids:
        if node_id not in reachable:
            rank[node_id] += below
    position = {node_id: index for index, node_id in enumerate(ids)}
    order = sorted(ids, key=lambda n: (rank[n], n != graph.start_at, position[n]))
    return Layout(tuple(order), rank, frozenset(back))


@dataclass
class _Row:
    content: str = ""
    node_id: str | None = None
    taken: bool = False  # the content's line glyphs show a taken transition
    edge: GraphEdge | None = None


def render(
    graph: WorkflowGraph, progress: RunProgress, width: int = DEFAULT_WIDTH
) -> list[GraphLine]:
    """The graph with `progress` drawn on it, as lines no wider than `width` (details are
    cut to fit; very long node ids may still overflow).

    A node's only, unlabelled edge to the node listed next, its only forward way in, is a
    stem (`│`); every other transition is a line of its own naming its target.
    """
    plan = layout(graph)
    incoming = {node_id: 0 for node_id, _ in graph.nodes}
    for e in graph.edges:
        if e not in plan.back_edges:  # a way back in arrives by the gutter
            incoming[e.dst] += 1
    rows: list[_Row] = []
    for index, node_id in enumerate(plan.order):
        rows.append(_Row(node_id=node_id))
        following = plan.order[index + 1] if index + 1 < len(plan.order) else None
        edges = graph.outgoing(node_id)
        if (
            len(edges) == 1
            and edges[0].label is None
            and edges[0].dst == following
            and incoming[following] == 1  # a join lists each way in, by name
        ):
            taken = (node_id, following) in progress.taken
            rows.append(_Row("┃" if taken else "│", taken=taken))
            continue
        for number, e in enumerate(edges):
            rows.append(_edge_row(e, progress, last=number == len(edges) - 1))
        if following is not None and plan.rank[following] != plan.rank[node_id] and edges:
            rows.append(_Row())
    gutter = _Gutter(rows, plan.back_edges, progress)
    node_types = dict(graph.nodes)
    lines = []
    for number, row in enumerate(rows):
        prefix, prefix_taken = gutter.cells(number)
        if row.node_id is not None:
            content = _node_text(
                row.node_id, node_types[row.node_id], progress, width - len(prefix)
            )
        else:
            content = row.content
        if row.edge is not None and row.edge in plan.back_edges:
            content = _with_left_arm(content)
        spans = list(prefix_taken)
        if row.taken:
            start = len(prefix)
            if spans and spans[-1][1] == start:
                start = spans.pop()[0]
            spans.append((start, len(prefix) + len(content)))
        lines.append(GraphLine((prefix + content).rstrip(), row.node_id, tuple(spans)))
    return lines


def render_text(graph: WorkflowGraph, progress: RunProgress, width: int = DEFAULT_WIDTH) -> str:
    """`render` as plain text, one line each."""
    return "\n".join(line.text for line in render(graph, progress, width)) + "\n"


def _edge_row(e: GraphEdge, progress: RunProgress, *, last: bool) -> _Row:
    taken = (e.src, e.dst) in progress.taken
    line = "━" if taken else "─"
    corner = ("┗" if last else "┣") if taken else ("└" if last else "├")
    label = f"{line} {e.label} {line}" if e.label is not None else line
    return _Row(f"{corner}{label}{ARROW} {e.dst}", taken=taken, edge=e)


_LEFT_ARM = {"├": "┼", "└": "┴", "┣": "╋", "┗": "┻"}


def _with_left_arm(content: str) -> str:
    """A back edge leaves its node's column to the left, into the gutter."""
    return _LEFT_ARM[content[0]] + content[1:]


def _node_text(node_id: str, node_type: str, progress: RunProgress, room: int) -> str:
    state = progress.node(node_id)
    text = f"{GLYPHS[state.status]} {node_id}  {node_type}"
    if state.attempts > 1:
        text += f"  ×{state.attempts}"
    if state.status == "running" and state.elapsed_ms is not None:
        text += f"  {format_elapsed(state.elapsed_ms)}"
    if state.detail:
        detail = " ".join(state.detail.split())
        space = room - len(text) - 2
        if space >= 4:
            text += "  " + (detail if len(detail) <= space else detail[: space - 1] + "…")
    return text


def format_elapsed(ms: int) -> str:
    """`12s`, `3m04s`, `1h02m`."""
    seconds = max(ms, 0) // 1000
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# Crossing glyphs by (horizontal heavy, vertical heavy).
_CROSSINGS = {(False, False): "┼", (True, True): "╋", (True, False): "┿", (False, True): "╂"}


class _Gutter:
    """The left gutter: one column per back edge, running from the row of the edge up to
    the row of the node it returns to. Shorter spans sit nearer the graph."""

    def __init__(self, rows: list[_Row], back_edges: frozenset[GraphEdge], progress: RunProgress):
        node_row = {row.node_id: n for n, row in enumerate(rows) if row.node_id is not None}
        spans = []
        for n, row in enumerate(rows):
            if row.edge is not None and row.edge in back_edges:
                heavy = (row.edge.src, row.edge.dst) in progress.taken
                spans.append((node_row[row.edge.dst], n, heavy))
        spans.sort(key=lambda span: span[0] - span[1])  # longest first: outermost
        self.width = 2 * len(spans) + 2 if spans else 0
        self.grid = [[" "] * self.width for _ in rows]
        self.heavy = [[False] * self.width for _ in rows]
        # Every vertical first, so each horizontal can cross the ones in its way.
        for column, (top, bottom, heavy) in enumerate(spans):
            for y in range(top + 1, bottom):
                self._put(y, 2 * column, "┃" if heavy else "│", heavy)
        for column, (top, bottom, heavy) in enumerate(spans):
            x = 2 * column
            self._put(top, x, "┏" if heavy else "┌", heavy)
            self._put(bottom, x, "┗" if heavy else "└", heavy)
            for y, end in ((top, self.width - 2), (bottom, self.width)):
                for across in range(x + 1, end):
                    self._across(y, across, heavy)
            self._put(top, self.width - 2, ARROW, heavy)

    def _put(self, y: int, x: int, glyph: str, heavy: bool) -> None:
        self.grid[y][x] = glyph
        self.heavy[y][x] = heavy

    def _across(self, y: int, x: int, heavy: bool) -> None:
        here = self.grid[y][x]
        if here in "│┃":
            self._put(y, x, _CROSSINGS[(heavy, here == "┃")], heavy or self.heavy[y][x])
        elif here == " ":
            self._put(y, x, "━" if heavy else "─", heavy)

    def cells(self, y: int) -> tuple[str, list[tuple[int, int]]]:
        """Row `y` of the gutter, and its columns that show taken transitions."""
        if not self.width:
            return "", []
        spans: list[tuple[int, int]] = []
        for x in range(self.width):
            if self.heavy[y][x]:
                if spans and spans[-1][1] == x:
                    spans[-1] = (spans[-1][0], x + 1)
                else:
                    spans.append((x, x + 1))
        return "".join(self.grid[y]), spans
