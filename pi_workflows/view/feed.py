"""What the viewer is told by the host: a watch (`view.runs.watch`, `view.run.watch`) on a
connection of its own, read in a thread, each pushed payload handed to a callback.

The viewer never polls the database: a pushed `runs_changed` carries the runs that moved,
a pushed `run_progress` says that a run moved (and what holds it now), and the viewer
then asks for what it shows. A lost host is reported once, and the watch is taken up
again (from the start: what a viewer shows is read afresh) when the host is back.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any

from ..client.session_client import SessionConnection
from ..errors import HostBusyError, HostProtocolError, HostUnavailableError, PiWorkflowsError
from ..home import Home

TICK_S = 0.2
RECONNECT_S = 1.0


class HostFeed:
    """One watch; `on_event(event name, payload)` and `on_lost(error text)` are called in
    the feed's thread (a Textual app hands them over with `call_from_thread`)."""

    def __init__(
        self,
        home: Home,
        operation: str,
        on_event: Callable[[str, dict[str, Any]], None],
        on_lost: Callable[[str], None],
        *,
        run_id: str | None = None,
    ) -> None:
        self.home = home
        self.operation = operation
        self.run_id = run_id
        self.on_event = on_event
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="piw-view-feed", daemon=True)

    def start(self) -> HostFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop soon; the thread lets go of its connection within one tick."""
        self._stop.set()

    def _serve(self) -> None:
        lost = False
        while not self._stop.is_set():
            try:
                connection = self._subscribe()
            except (HostUnavailableError, HostBusyError, HostProtocolError) as error:
                if not lost:
                    self._deliver(self.on_lost, str(error))
                lost = True
                self._stop.wait(RECONNECT_S)
                continue
            except PiWorkflowsError as error:  # refused: the run is gone, say so and end
                self._deliver(self.on_lost, str(error))
                return
            lost = False
            try:
                self._read(connection)
            except (HostUnavailableError, HostProtocolError) as error:
                self._deliver(self.on_lost, str(error))
                lost = True
            finally:
                connection.close()

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        """Hand over to the receiver, unless stopped; a receiver that is gone (an app
        that exited raises RuntimeError) stops the feed."""
        if self._stop.is_set():
            return
        try:
            callback(*args)
        except RuntimeError:
            self._stop.set()

    def _subscribe(self) -> SessionConnection:
        connection = SessionConnection(self.home.socket_path)
        subscription = f"viewer-{secrets.token_hex(6)}"
        reply = connection.request(
            self.operation, {"subscriptionId": subscription}, run_id=self.run_id
        )
        if not reply.ok:
            connection.close()
            raise PiWorkflowsError(reply.error or f"{self.operation} was {reply.outcome}.")
        return connection

    def _read(self, connection: SessionConnection) -> None:
        while not self._stop.is_set():
            event = connection.next_event(TICK_S)
            if event is not None:
                self._deliver(self.on_event, event["event"], event["payload"])
