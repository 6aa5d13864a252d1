"""The run view: the run's graph with its progress, its steps to scrub through, panes for
the selected step, its transcript, what the run waits for and its effects, and keys to
act on it.

It follows the host: each `run_progress` the host pushes (`view.run.watch`) says the run
moved and what holds it now; the view then reads the run's graph (`run.graph`), status,
pending decision and effects, and redraws. Selecting an earlier step draws the graph as
it was after that step; the last one is live. When the run is answered and a
continuation carries it on, the view follows the continuation (whose steps begin with
those it carried over).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from ..client.connection import RequestFailed
from ..errors import PiWorkflowsError
from .dialogs import AnswerDialog, ConfirmDialog
from .feed import HostFeed
from .graph import GLYPHS, WorkflowGraph, render
from .progress import entries_until_step, run_progress, step_entries, with_entries
from .text import pretty, run_glyph, run_reason, step_line, transcript_line

if TYPE_CHECKING:
    from .app import ViewerApp

STATUS_STYLES = {
    "done": "green",
    "failed": "red",
    "running": "yellow",
    "waiting": "magenta",
    "pending": "dim",
}
TICK_S = 1.0  # a running node's elapsed time is redrawn this often
PANES = ("step", "transcript", "waiting", "effects")
EFFECT_IN_DOUBT = "effectAmbiguous"  # the `run why` code of a run held by an effect


@dataclass
class RunData:
    """What the view shows of a run, read together after each push."""

    graph: dict[str, Any]  # the run.graph answer
    status: dict[str, Any]  # the run.status object
    decision: dict[str, Any] | None  # its pending human decision
    effects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def items(self) -> list[dict[str, Any]]:
        """The steps, then the attempt running now (without an outcome)."""
        current = self.graph["current"]
        return [*self.graph["steps"], *([current] if current is not None else [])]

    @property
    def in_doubt(self) -> dict[str, Any] | None:
        return next((e for e in self.effects if e["status"] == "ambiguous"), None)


class RunScreen(Screen[None]):
    """One run, live."""

    app: ViewerApp
    BINDINGS = [
        Binding("left,k", "step(-1)", "earlier step"),
        Binding("right,j", "step(1)", "later step"),
        Binding("home", "first_step", "first", show=False),
        Binding("end", "live", "live"),
        Binding("a", "answer", "answer"),
        Binding("p", "pause", "pause"),
        Binding("r", "resume", "resume"),
        Binding("x", "cancel", "cancel"),
        Binding("e", "effect('confirm')", "effect confirm"),
        Binding("E", "effect('retry')", "effect retry"),
        Binding("1", "pane('step')", "step", show=False),
        Binding("2", "pane('transcript')", "transcript", show=False),
        Binding("3", "pane('waiting')", "waiting", show=False),
        Binding("4", "pane('effects')", "effects", show=False),
        Binding("q", "back", "back"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.data: RunData | None = None
        self.why = ""
        self.why_code: str | None = None
        self.shown_pane = "step"  # effects and transcripts are read while their pane shows
        self.selected = -1  # index into data.items; -1: none yet
        self.live = True  # the last item stays selected as the run moves on
        self.feed: HostFeed | None = None
        self._refreshing = False
        self._again = False
        self._transcripts: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static(self.run_id, id="title")
        yield Static("", id="why")
        with Horizontal(id="main"):
            with VerticalScroll(id="graph-pane"):
                yield Static("", id="graph")
            with VerticalScroll(id="steps-pane"):
                yield Static("", id="steps")
        with TabbedContent(id="panes", initial="step"):
            for pane in PANES:
                with TabPane(pane, id=pane), VerticalScroll():
                    yield Static("", id=f"{pane}-text")
        yield Static("", id="message")
        yield Footer()

    async def on_mount(self) -> None:
        self._follow()
        await self.refresh_run()
        self.set_interval(TICK_S, self._tick)

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.stop()

    def _follow(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        app = self.app  # the feed's thread has no active app to look up
        self.feed = HostFeed(
            self.app.home,
            "view.run.watch",
            lambda _name, payload: app.call_from_thread(self.run_moved, payload),
            lambda error: app.call_from_thread(self.show_message, f"host: {error}"),
            run_id=self.run_id,
        ).start()

    # --- data ---------------------------------------------------------------------------

    def run_moved(self, payload: dict[str, Any]) -> None:
        """A push: the run moved; `why` says what holds it now."""
        if payload.get("runId") != self.run_id:
            return  # from the run this view followed before its continuation
        known = self.data
        if (
            known is not None
            and known.graph["runId"] == self.run_id
            and payload.get("revision", 0) < known.status["revision"]
        ):
            # Sent before what a read on another connection already showed (the two
            # travel apart): it would take the view back for a moment.
            return
        why = payload.get("why") or {}
        self.why, self.why_code = why.get("reason") or "", why.get("code")
        if known is not None and known.graph["runId"] == self.run_id and payload["entries"]:
            # Drawn at once from what was pushed; the read below fills in the values.
            graph = with_entries(known.graph, payload["entries"])
            # At the push's revision: an older push that comes before the read is refused.
            revision = payload.get("revision", known.status["revision"])
            status = {**known.status, **payload["status"], "revision": revision}
            self._show(RunData(graph, status, known.decision, known.effects))
        self.call_later(self.refresh_run)

    async def refresh_run(self) -> None:
        """Read the run again; pushes that come while reading make one more read."""
        if self._refreshing:
            self._again = True
            return
        self._refreshing = True
        try:
            while True:
                self._again = False
                try:
                    data = await asyncio.to_thread(self._read, self.run_id)
                except PiWorkflowsError as error:
                    self.show_message(str(error))
                    return
                if not self.is_attached:  # closed while the host answered
                    return
                carried = data.status.get("continuation")
                if carried and carried["latestRunId"] != self.run_id:
                    self.show_message(f"{self.run_id} {run_reason(data.status)}; following it")
                    self.run_id = carried["latestRunId"]
                    self._follow()
                    continue
                self._show(data)
                if not self._again:
                    return
        finally:
            self._refreshing = False

    def _read(self, run_id: str) -> RunData:
        """One request while the run just moves on; its decision while it waits, and its
        effects on the first read, while one is in doubt or the effects pane shows them."""
        client = self.app.client
        graph = client.run_graph(run_id)
        status = graph["run"]
        decision = None
        if status["status"] == "waiting" and status.get("continuation") is None:
            decision = next((d for d in client.list_decisions() if d["runId"] == run_id), None)
        known = self.data
        if (
            known is None
            or known.graph["runId"] != run_id
            or self.why_code == EFFECT_IN_DOUBT
            or known.in_doubt is not None  # until it is settled
            or self.shown_pane == "effects"
        ):
            effects = client.list_effects(run_id=run_id)
        else:
            effects = known.effects
        return RunData(graph, status, decision, effects)

    def _show(self, data: RunData) -> None:
        before = len(self.data.items) if self.data is not None else 0
        self.data = data
        count = len(data.items)
        if self.live or self.selected >= count:
            self.selected = count - 1
        elif count != before and self.selected < 0:
            self.selected = count - 1
        self.draw()

    # --- drawing ------------------------------------------------------------------------

    def draw(self) -> None:
        data = self.data
        if data is None:
            return
        status = data.status
        title = f"{run_glyph(status)} {status['workflowName']}  {self.run_id}  {status['status']}"
        if status.get("paused"):
            title += " (paused)"
        self.query_one("#title", Static).update(title)
        self.query_one("#why", Static).update(f"why: {self.why or run_reason(status) or '-'}")
        self._draw_graph()
        self._draw_steps()
        self._draw_step_pane()
        self._draw_waiting()
        self._draw_effects()

    def _draw_graph(self) -> None:
        data = self.data
        assert data is not None
        pane = self.query_one("#graph", Static)
        definition = data.graph["definition"]
        if definition is None:
            pane.update(
                "This run's graph was not recorded when it started (an older client "
                "started it); its steps are listed on the right."
            )
            return
        graph = WorkflowGraph.from_snapshot(definition)
        entries = step_entries(data.graph["steps"], data.graph["current"])
        if self.live:
            progress = run_progress(graph, entries, data.status, int(time.time() * 1000))
        else:
            progress = run_progress(graph, entries_until_step(entries, self.selected + 1))
        width = max(self.query_one("#graph-pane").size.width - 2, 40)
        selected = self._selected_item()
        selected_node = selected["nodeId"] if selected is not None else None
        text = Text()
        for line in render(graph, progress, width):
            row = Text(line.text)
            for start, end in line.taken:
                row.stylize("bold", start, end)
            if line.node_id is not None:
                state = progress.node(line.node_id)
                at = line.text.find(f"{GLYPHS[state.status]} {line.node_id}")
                if at >= 0:
                    row.stylize(STATUS_STYLES[state.status], at, at + 1)
                    if line.node_id == selected_node:
                        row.stylize("reverse", at + 2, at + 2 + len(line.node_id))
            text.append_text(row)
            text.append("\n")
        pane.update(text)

    def _draw_steps(self) -> None:
        data = self.data
        assert data is not None
        items = data.items
        where = "live" if self.live else f"step {self.selected + 1} of {len(items)}"
        text = Text(f"steps ({where})\n", style="bold")
        # The step a run waits at finished (its output is the question): drawn waiting.
        waits = data.status["status"] == "waiting" and data.status.get("continuation") is None
        for number, item in enumerate(items):
            waiting = waits and number == len(items) - 1
            row = Text(step_line(number + 1, item, waiting=waiting) + "\n")
            if number == self.selected:
                row.stylize("reverse")
            text.append_text(row)
        self.query_one("#steps", Static).update(text)

    def _selected_item(self) -> dict[str, Any] | None:
        items = self.data.items if self.data is not None else []
        return items[self.selected] if 0 <= self.selected < len(items) else None

    def _draw_step_pane(self) -> None:
        item = self._selected_item()
        pane = self.query_one("#step-text", Static)
        if item is None:
            pane.update("No step has run yet.")
            return
        lines = [f"{item['nodeId']} ({item.get('nodeType')}) attempt {item['attemptId']}"]
        if item.get("outcome") is None:
            lines.append("running")
        else:
            lines.append(f"outcome: {item['outcome']}")
        for key in ("prompt", "output", "error"):
            if item.get(key) is not None:
                lines += [f"— {key} —", pretty(item[key])]
        pane.update(Text("\n".join(lines)))
        if self.shown_pane == "transcript":
            self._show_transcript(item)

    def _show_transcript(self, item: dict[str, Any]) -> None:
        pane = self.query_one("#transcript-text", Static)
        cached = self._transcripts.get(item["attemptId"])
        if cached is not None:
            pane.update(Text(cached))
            return
        pane.update("…")
        self._read_transcript(self.run_id, item)

    @work(exclusive=True, group="transcript")  # the latest selection's read wins
    async def _read_transcript(self, run_id: str, item: dict[str, Any]) -> None:
        try:
            found = await asyncio.to_thread(self.app.client.run_transcript, run_id, item["nodeId"])
        except PiWorkflowsError as error:
            self.query_one("#transcript-text", Static).update(str(error))
            return
        mine = [t for t in found if t["attemptId"] == item["attemptId"]]
        if not mine:
            text = "No agent transcript for this step."
        else:
            text = "\n".join(transcript_line(entry) for entry in mine[0]["entries"])
        if item.get("outcome") is not None:  # a running attempt's grows yet
            self._transcripts[item["attemptId"]] = text
        selected = self._selected_item()
        if selected is not None and selected["attemptId"] == item["attemptId"]:
            self.query_one("#transcript-text", Static).update(Text(text))

    def _draw_waiting(self) -> None:
        data = self.data
        assert data is not None
        status = data.status
        pane = self.query_one("#waiting-text", Static)
        if data.decision is not None:
            choices = "\n".join(
                f"  {key}: {choice['label']}" + (" (with text)" if choice.get("input") else "")
                for key, choice in data.decision["choices"].items()
            )
            pane.update(f"decision: {data.decision['title']}\n{choices}\na: answer")
        elif status["status"] == "waiting" and status.get("continuation") is None:
            if self.why_code == "decision":  # pushed before the next read brings it
                pane.update("decision: reading it from the host…")
            else:
                pane.update(f"checkpoint: {_checkpoint_summary(status)}\na: answer")
        else:
            pane.update("Nothing to answer.")

    def _draw_effects(self) -> None:
        data = self.data
        assert data is not None
        if not data.effects:
            self.query_one("#effects-text", Static).update("No effects.")
            return
        lines = [
            f"{e['effectId']}  {e['status']}  {e['effectType']} ({e['policy']}, "
            f"{e['attempts']} attempts)  node {e['nodeId']}"
            for e in data.effects
        ]
        if data.in_doubt is not None:
            lines.append(f"in doubt: {data.in_doubt['effectId']}  e: confirm  E: retry")
        self.query_one("#effects-text", Static).update(Text("\n".join(lines)))

    def _tick(self) -> None:
        if self.live and self.data is not None and self.data.graph["current"] is not None:
            self._draw_graph()

    def show_message(self, text: str) -> None:
        if self.is_attached:  # a reply may come after the view closed
            self.query_one("#message", Static).update(Text(text))

    # --- scrubbing ----------------------------------------------------------------------

    def action_step(self, delta: int) -> None:
        if self.data is None or not self.data.items:
            return
        last = len(self.data.items) - 1
        self.selected = min(max(self.selected + delta, 0), last)
        self.live = self.selected == last
        self.draw()

    def action_first_step(self) -> None:
        self.action_step(-len(self.data.items) if self.data else 0)

    def action_live(self) -> None:
        self.action_step(len(self.data.items) if self.data else 0)

    def action_pane(self, pane: str) -> None:
        self.query_one(TabbedContent).active = pane

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.shown_pane = event.pane.id or "step"
        item = self._selected_item()
        if self.shown_pane == "transcript" and item is not None:
            self._show_transcript(item)
        elif self.shown_pane == "effects":
            await self.refresh_run()

    # --- acting -------------------------------------------------------------------------

    async def _act(self, what: str, call: Callable[[], Any]) -> None:
        """Call the client off the UI thread; show its receipt's detail or the refusal."""
        try:
            receipt = await asyncio.to_thread(call)
        except PiWorkflowsError as error:
            self.show_message(f"{what}: {error}")
            return
        detail = (
            receipt.get("detail") or receipt.get("status") if isinstance(receipt, dict) else None
        )
        self.show_message(f"{what}: {detail or 'done'}")
        await self.refresh_run()

    async def action_pause(self) -> None:
        await self._act("pause", lambda: self.app.client.pause_run(self.run_id))

    async def action_resume(self) -> None:
        await self._act("resume", lambda: self.app.client.resume_run(self.run_id))

    def action_cancel(self) -> None:
        run_id = self.run_id

        async def confirmed(yes: bool | None) -> None:
            if yes:
                await self._act("cancel", lambda: self.app.client.cancel_run(run_id))

        self.app.push_screen(ConfirmDialog(f"Cancel run {run_id}?"), confirmed)

    async def action_effect(self, how: str) -> None:
        effect = self.data.in_doubt if self.data is not None else None
        if effect is None:
            self.show_message(f"effect {how}: no effect of this run is in doubt")
            return
        method = (
            self.app.client.confirm_effect if how == "confirm" else self.app.client.retry_effect
        )
        await self._act(f"effect {how}", lambda: method(effect["effectId"]))

    def action_answer(self) -> None:
        data = self.data
        if data is None:
            return
        status = data.status
        if data.decision is not None:
            decision = data.decision
            dialog = AnswerDialog(decision["title"], decision, self._decision_sender(decision))
        elif status["status"] == "waiting" and status.get("continuation") is None:
            dialog = AnswerDialog(
                f"checkpoint: {_checkpoint_summary(status)}", None, self._checkpoint_sender()
            )
        else:
            self.show_message(f"answer: {self.run_id} waits for no answer ({status['status']})")
            return

        async def answered(_: None) -> None:
            await self.refresh_run()

        self.app.push_screen(dialog, answered)

    def _decision_sender(self, decision: dict[str, Any]) -> Callable[[dict], str | None]:
        def send(answer: dict[str, Any]) -> str | None:
            try:
                response = self.app.client.answer_decision(
                    decision["decisionId"], answer["choice"], answer.get("input")
                )
            except PiWorkflowsError as error:
                return str(error)
            return None if response.ok else response.error or response.outcome

        return send

    def _checkpoint_sender(self) -> Callable[[dict], str | None]:
        run_id = self.run_id

        def send(answer: dict[str, Any]) -> str | None:
            try:
                self.app.client.answer_checkpoint(run_id, answer["input"])
            except (RequestFailed, PiWorkflowsError) as error:
                return str(error)
            return None

        return send

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()
        else:
            self.app.exit()


def _checkpoint_summary(status: dict[str, Any]) -> str:
    output = status.get("finalOutput")
    summary = output.get("summary") if isinstance(output, dict) else None
    return status.get("statusDetail") or summary or "waits for an answer"
