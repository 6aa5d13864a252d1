"""`pi-workflows view [RUN]`: the runs list and the run view as one Textual app.

The app talks to the host only through `pi_workflows.client` — the same operations and
refusals as the command line — with one client shared by its threads one call at a time,
and a watch per screen for what the host pushes (`feed.HostFeed`).
"""

from __future__ import annotations

import threading
from typing import Any

from textual.app import App

from ..client.workflow_client import WorkflowClient
from ..home import Home
from .run_screen import RunScreen
from .runs_screen import RunsScreen

CSS = """
#title { text-style: bold; height: 1; }
#why { height: 1; color: $text-muted; }
#message { height: 1; color: $warning; }
#main { height: 1fr; }
#graph-pane { width: 2fr; }
#steps-pane { width: 1fr; min-width: 24; border-left: solid $primary-darken-2; }
#panes { height: 10; }
#runs { height: 1fr; }
ModalScreen { align: center middle; }
.dialog { width: 70; height: auto; border: thick $primary; background: $surface; padding: 1 2; }
.buttons { height: auto; margin-top: 1; }
.buttons Button { margin-right: 1; }
#error { color: $error; height: auto; }
"""


class LockedClient:
    """The app's one `WorkflowClient`, used by its threads one call at a time (a client
    holds one connection, which carries one request at a time)."""

    def __init__(self, client: WorkflowClient) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return method(*args, **kwargs)

        return locked


class ViewerApp(App[None]):
    """Runs list first, or straight into the run view of `run_id`."""

    TITLE = "pi-workflows view"
    CSS = CSS

    def __init__(self, client: WorkflowClient, run_id: str | None = None) -> None:
        super().__init__()
        self.home: Home = client.home
        self.client = LockedClient(client)
        self.first_run_id = run_id

    def on_mount(self) -> None:
        if self.first_run_id is not None:
            self.push_screen(RunScreen(self.first_run_id))
        else:
            self.push_screen(RunsScreen())

    def open_run(self, run_id: str) -> None:
        self.push_screen(RunScreen(run_id))
