"""The runs list: newest first, live, filtered by status and workflow, paged by run id.

The first page comes from `run.list`; the host's `view.runs.watch` then pushes every run
whose revision moved, which updates its row or, for a new run that passes the filter,
adds it at the top. Scrolling to the last row reads the next page after it (`before`),
one index range read however many runs the database holds.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from ..errors import PiWorkflowsError
from .feed import HostFeed
from .text import age, run_glyph, run_reason

if TYPE_CHECKING:
    from .app import ViewerApp

PAGE_SIZE = 100
STATUSES = ("queued", "running", "waiting", "completed", "failed", "timed_out", "cancelled")
AGE_REFRESH_S = 5.0


def parse_filter(text: str) -> tuple[str | None, str | None]:
    """`waiting branch` → (status "waiting", workflow "branch"); either may be left out."""
    status = workflow = None
    for word in text.split():
        if word in STATUSES:
            status = word
        else:
            workflow = word
    return status, workflow


class RunsScreen(Screen[None]):
    """Every run the host knows, newest first."""

    app: ViewerApp
    BINDINGS = [
        Binding("enter", "open_run", "open"),
        Binding("slash", "filter", "filter"),
        Binding("escape", "clear_filter", "all runs", show=False),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[dict[str, Any]] = []  # shown, newest first
        self.status: str | None = None
        self.workflow: str | None = None
        self.exhausted = False  # the last page read was the last one
        self.feed: HostFeed | None = None
        self._loading_page = False

    def compose(self) -> ComposeResult:
        yield Static("runs", id="title")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Input(
            placeholder="filter: a status and/or a workflow, e.g. waiting branch", id="filter"
        )
        yield Static("", id="message")
        yield Footer()

    async def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label, key in (
            ("", "glyph"),
            ("workflow", "workflow"),
            ("run", "run"),
            ("age", "age"),
            ("why", "why"),
        ):
            table.add_column(label, key=key)
        self.query_one("#filter", Input).display = False
        await self.reload()
        app = self.app  # the feed's thread has no active app to look up
        self.feed = HostFeed(
            self.app.home,
            "view.runs.watch",
            lambda _name, payload: app.call_from_thread(self.runs_changed, payload["runs"]),
            lambda error: app.call_from_thread(self.show_message, f"host: {error}"),
        ).start()
        self.set_interval(AGE_REFRESH_S, self.redraw)

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.stop()

    # --- data ---------------------------------------------------------------------------

    async def reload(self) -> None:
        """The first page for the current filter."""
        page = await self._page(None)
        if page is not None:
            self.runs = page
            self.exhausted = len(page) < PAGE_SIZE
            self.redraw()

    async def _page(self, before: str | None) -> list[dict[str, Any]] | None:
        """A page of runs; None when it failed (said on the message line) or the list
        closed while the host answered."""
        try:
            page = await asyncio.to_thread(
                self.app.client.list_runs,
                PAGE_SIZE,
                before=before,
                status=self.status,
                workflow=self.workflow,
            )
        except PiWorkflowsError as error:
            if self.is_attached:
                self.show_message(str(error))
            return None
        return page if self.is_attached else None

    def runs_changed(self, changed: list[dict[str, Any]]) -> None:
        """Merge what the host pushed: changed rows in place, new runs at the top."""
        if not self.is_attached:  # a push that was on its way when the list closed
            return
        by_id = {run["runId"]: run for run in self.runs}
        new = []
        moved = []
        for run in changed:
            known = by_id.get(run["runId"])
            if known is not None:
                if any(known.get(key) != value for key, value in run.items()):
                    known.update(run)
                    moved.append(known)
            elif self._passes(run) and self._newer_than_oldest(run):
                new.append(run)
        if new:
            self.runs = sorted(
                [*new, *self.runs], key=lambda r: (r["createdAt"], r["runId"]), reverse=True
            )
            self.redraw()
            return
        # A watch's first push repeats the page just read: nothing to draw then.
        table = self.query_one(DataTable)
        for run in moved:
            table.update_cell(run["runId"], "glyph", run_glyph(run))
            table.update_cell(run["runId"], "why", run_reason(run))

    def _passes(self, run: dict[str, Any]) -> bool:
        return (self.status is None or run["status"] == self.status) and (
            self.workflow is None or run["workflowName"] == self.workflow
        )

    def _newer_than_oldest(self, run: dict[str, Any]) -> bool:
        """A run older than the last row shown belongs to a page not read yet."""
        if not self.runs or self.exhausted:
            return True
        oldest = self.runs[-1]
        return (run["createdAt"], run["runId"]) > (oldest["createdAt"], oldest["runId"])

    # --- drawing ------------------------------------------------------------------------

    def redraw(self) -> None:
        table = self.query_one(DataTable)
        selected = self.selected_run_id()
        now = int(time.time() * 1000)
        table.clear()
        for run in self.runs:
            table.add_row(
                run_glyph(run),
                run["workflowName"],
                run["runId"],
                age(run.get("createdAt"), now),
                run_reason(run),
                key=run["runId"],
            )
        if selected is not None and selected in {run["runId"] for run in self.runs}:
            table.move_cursor(row=table.get_row_index(selected), animate=False)
        shown = f"{len(self.runs)}{'' if self.exhausted else '+'} runs"
        filters = " ".join(f for f in (self.status, self.workflow) if f)
        self.query_one("#title", Static).update(
            f"runs  {shown}" + (f"  filter: {filters}" if filters else "")
        )

    def selected_run_id(self) -> str | None:
        table = self.query_one(DataTable)
        if not self.runs or table.row_count == 0:
            return None
        return self.runs[min(table.cursor_row, len(self.runs) - 1)]["runId"]

    def show_message(self, text: str) -> None:
        self.query_one("#message", Static).update(text)

    # --- actions ------------------------------------------------------------------------

    async def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row < len(self.runs) - 1 or self.exhausted or self._loading_page:
            return
        self._loading_page = True  # one page at a time however fast the cursor moves
        try:
            page = await self._page(self.runs[-1]["runId"])
            if page is not None:
                known = {run["runId"] for run in self.runs}
                self.runs += [run for run in page if run["runId"] not in known]
                self.exhausted = len(page) < PAGE_SIZE
                self.redraw()
        finally:
            self._loading_page = False

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_run()

    def action_open_run(self) -> None:
        run_id = self.selected_run_id()
        if run_id is not None:
            self.app.open_run(run_id)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        self.status, self.workflow = parse_filter(event.value)
        event.input.display = False
        self.query_one(DataTable).focus()
        await self.reload()

    async def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value, box.display = "", False
        self.query_one(DataTable).focus()
        if self.status is not None or self.workflow is not None:
            self.status = self.workflow = None
            await self.reload()
