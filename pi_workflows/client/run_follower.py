"""Following one run live over `view.run.watch` (what `run watch` and `run start --wait`
show on a terminal).

The host pushes `run_progress` events until the run is settled (terminal, waiting, or
held until someone acts). If the host goes away, the follower reconnects (starting the
host again when autostart is allowed) and resubscribes after the last revision it saw,
so no progress entry is shown twice or lost.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from ..errors import HostUnavailableError, RunWaitTimedOut
from ..home import Home
from .autostart import connect
from .connection import RequestFailed
from .session_client import SessionConnection

RECONNECT_WINDOW_S = 30.0
TICK_S = 0.1


def follow_run(
    home: Home,
    run_id: str,
    on_progress: Callable[[dict[str, Any]], None],
    *,
    database_url: str | None = None,
    autostart: bool = True,
    on_tick: Callable[[], None] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Call `on_progress(payload)` for every `run_progress` event until the run settles.

    `on_tick` is called about every 0.1 s while nothing arrives (a spinner redraws).
    Returns the settling payload; raises RunWaitTimedOut after `timeout_s`.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    revision = 0
    while True:
        connection = _subscribe(home, run_id, revision, database_url, autostart)
        try:
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    raise RunWaitTimedOut(
                        f"Run {run_id} did not settle within {timeout_s:g} s; check it with "
                        f"'pi-workflows run why {run_id}'."
                    )
                event = connection.next_event(TICK_S)
                if event is None:
                    if on_tick is not None:
                        on_tick()
                    continue
                if event.get("event") != "run_progress":
                    continue
                payload: dict[str, Any] = event["payload"]
                revision = max(revision, payload["revision"])
                on_progress(payload)
                if payload["settled"]:
                    return payload
        except HostUnavailableError:
            continue  # resubscribe after the last revision seen
        finally:
            connection.close()


def _subscribe(
    home: Home, run_id: str, after: int, database_url: str | None, autostart: bool
) -> SessionConnection:
    """Subscribe again until a host takes the watch; a host that stops before it answers
    (a restart that crosses the subscription) is waited out like one that is not there."""
    give_up = time.monotonic() + RECONNECT_WINDOW_S
    while True:
        try:
            return _watch(home, run_id, after, database_url, autostart)
        except HostUnavailableError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(TICK_S)


def _watch(
    home: Home, run_id: str, after: int, database_url: str | None, autostart: bool
) -> SessionConnection:
    connect(home, database_url, autostart=autostart).close()
    connection = SessionConnection(home.socket_path)
    try:
        reply = connection.request(
            "view.run.watch",
            {"subscriptionId": f"run-watch-{secrets.token_hex(6)}", "afterRevision": after},
            run_id=run_id,
        )
    except BaseException:
        connection.close()
        raise
    if not reply.ok:
        connection.close()
        raise RequestFailed(reply)
    return connection
