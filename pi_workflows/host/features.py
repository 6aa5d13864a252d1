"""The host's own features as plugins on a private hookspec (SPEC §3).

Sessions, human decisions, terminal messages and restarts are not wired into `Host` by
hand. Each is a plugin object on the host's own pluggy manager (project
``pi_workflows_host``; never loaded from entry points, so it is no public API) and sees
the host only through :class:`~pi_workflows.host.services.HostServices`, which it gets
when it is built: ``Feature(services)``. The list of features is :data:`FEATURES` in
``pi_workflows.host.runtime``.

How a feature adds something (implement the hook on the feature's class with
``@feature_hook``):

- a client operation: ``piwh_register_operations(operations)`` and
  ``operations.register_durable(name, handler)`` (the change and its receipt commit
  together), ``register_query`` or ``register_live`` (answers on its connection);
- a change to another feature's operation: ``operations.wrap_durable(name, wrapper)``
  with ``wrapper(request, proceed)``; call ``proceed(request)`` for the wrapped
  behaviour (``operations.wrap_live(name, wrapper)`` likewise for a live operation,
  ``await wrapper(request, connection, proceed=...)``). Wrappers are applied when the
  operation is called, so the order in which features register does not matter;
- periodic work: ``piwh_poll()`` runs on every poll tick (2 s); keep an idle tick
  read-only, so it takes no write lock;
- startup work: ``piwh_startup()`` runs after recovery and before the socket listens;
- after an outage: ``piwh_reconnected()`` runs once the lost database connection is
  back. A commit in flight when it dropped may or may not have happened, and what was
  to follow it did not: re-read the state and do what it still needs (read-only when
  nothing is missing);
- stop work: ``piwh_stopping()`` runs after workers were stopped and before the host
  gives up its epoch (close adapters, threads);
- reactions to runs: ``piwh_run_stopped(run_id, old_status, new_status)`` after a run
  left ``running`` (after commit), ``piwh_worker_operation(operation, run_id, payload,
  result)`` inside the transaction of a worker's state operation (raise to refuse it),
  ``piwh_ensure_terminal_message(run_id)`` when a run may have ended;
- answers about sessions: ``piwh_session_has_coordinator(session_id)`` (first answer
  wins), and about decisions: ``piwh_audience_channels(audience)``, the channels that may
  answer an audience's decisions (first answer wins);
- a part of ``host status``: ``piwh_host_status()`` returns fields to add (read-only;
  one that fails is logged and left out, so the status still answers).

Calls are isolated: a failing ``poll``, ``reconnected``, ``stopping``, ``run_stopped`` or
``ensure_terminal_message`` implementation is logged with the feature's name and the
others still run. ``startup``, ``register_operations`` and ``worker_operation`` raise,
because their caller must not go on as if they had succeeded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pluggy

from ..protocol.worker_messages import WorkerOperation

PROJECT_NAME = "pi_workflows_host"

feature_hookspec = pluggy.HookspecMarker(PROJECT_NAME)
feature_hook = pluggy.HookimplMarker(PROJECT_NAME)

log = logging.getLogger("pi_workflows.host")


class FeatureSpecs:
    """The private hookspec of host features."""

    @feature_hookspec
    def piwh_register_operations(self, operations: Any) -> None:
        """Add client operations to the `OperationTable`, or wrap another feature's."""

    @feature_hookspec
    def piwh_startup(self) -> None:
        """The host recovered its predecessor's state and is about to listen."""

    @feature_hookspec
    def piwh_poll(self) -> None:
        """One poll tick."""

    @feature_hookspec
    def piwh_reconnected(self) -> None:
        """The lost database connection is back; a commit's outcome may be unknown."""

    @feature_hookspec
    def piwh_stopping(self) -> None:
        """The host is stopping: workers are stopped, the epoch is still held."""

    @feature_hookspec
    def piwh_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        """A run left `running` (committed)."""

    @feature_hookspec
    def piwh_worker_operation(
        self, operation: WorkerOperation, run_id: str, payload: dict[str, Any], result: Any
    ) -> None:
        """A worker's state operation was applied (inside its transaction)."""

    @feature_hookspec
    def piwh_ensure_terminal_message(self, run_id: str) -> None:
        """The run may have ended: make sure its terminal message exists."""

    @feature_hookspec(firstresult=True)
    def piwh_session_has_coordinator(self, session_id: str) -> bool | None:
        """Whether a live client coordinates the session here (None: not known)."""

    @feature_hookspec(firstresult=True)
    def piwh_audience_channels(self, audience: str) -> tuple[str, ...] | None:
        """The channels that may answer decisions for `audience` (None: not known)."""

    @feature_hookspec
    def piwh_host_status(self) -> dict[str, Any]:  # type: ignore[empty-body]  # a spec: signature only
        """Fields this feature adds to `host status` (a read)."""


class HostFeatures:
    """The feature plugin manager and the calls the host makes into it."""

    def __init__(self, features: list[object]) -> None:
        self.manager = pluggy.PluginManager(PROJECT_NAME)
        self.manager.add_hookspecs(FeatureSpecs)
        for feature in features:
            self.manager.register(feature, name=type(feature).__name__)
        self.manager.check_pending()

    def _each(self, hook_name: str, raising: bool, **kwargs: Any) -> None:
        # In the order of FEATURES: a feature may rely on an earlier one having reacted.
        for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
            call: Callable[..., Any] = impl.function
            if raising:
                call(**kwargs)
                continue
            try:
                call(**kwargs)
            except Exception:
                log.exception("host feature %s failed in %s", impl.plugin_name, hook_name)

    def register_operations(self, operations: Any) -> None:
        self._each("piwh_register_operations", True, operations=operations)

    def startup(self) -> None:
        self._each("piwh_startup", True)

    def poll(self) -> None:
        self._each("piwh_poll", False)

    def reconnected(self) -> None:
        self._each("piwh_reconnected", False)

    def stopping(self) -> None:
        self._each("piwh_stopping", False)

    def run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        self._each(
            "piwh_run_stopped", False, run_id=run_id, old_status=old_status, new_status=new_status
        )

    def worker_operation(
        self, operation: WorkerOperation, run_id: str, payload: dict[str, Any], result: Any
    ) -> None:
        self._each(
            "piwh_worker_operation",
            True,
            operation=operation,
            run_id=run_id,
            payload=payload,
            result=result,
        )

    def ensure_terminal_message(self, run_id: str) -> None:
        self._each("piwh_ensure_terminal_message", False, run_id=run_id)

    def session_has_coordinator(self, session_id: str) -> bool:
        return bool(self.manager.hook.piwh_session_has_coordinator(session_id=session_id))

    def audience_channels(self, audience: str) -> tuple[str, ...]:
        return self.manager.hook.piwh_audience_channels(audience=audience) or ()

    def host_status(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for impl in self.manager.hook.piwh_host_status.get_hookimpls():
            try:
                fields.update(impl.function())  # type: ignore[call-overload]  # pluggy: object
            except Exception:
                log.exception("host feature %s failed in piwh_host_status", impl.plugin_name)
        return fields
