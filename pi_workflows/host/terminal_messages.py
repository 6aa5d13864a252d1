"""Terminal workflow messages: the never-throwing ensure step and its reconciliation.

A terminal state always commits first; the message follows after the commit (SPEC §7.5,
§10). If building or storing it fails — a rendering plugin raises, the host dies in
between — the run joins a pending set that the poll timer retries at most once a
second; a starting host finds every missing message before it serves clients, and so
does a host whose lost database connection came back (the commit that ended a run may
have happened without the host hearing of it).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from .. import plugins
from ..bounded_values import bounded_terminal_facts
from ..clock import now_ms
from ..errors import PluginError
from ..records import MessageContent, TerminalFacts
from ..storage.run_statuses import is_terminal_status
from ..storage.runs import run_record
from ..storage.terminal_facts import (
    StateOverride,
    is_required,
    latest_terminal_message,
    load_failure_override,
    runs_missing_terminal_messages,
    terminal_facts,
    terminal_fingerprint,
    terminal_message_id,
    terminal_source_id,
)
from ..storage.workflow_messages import create_workflow_message
from .features import feature_hook

if TYPE_CHECKING:
    from .services import HostServices

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_MS = 1000


class TerminalMessages:
    """Creates terminal messages after commit and retries the ones that failed."""

    def __init__(self, services: HostServices) -> None:
        self.services = services
        self.pending: set[str] = set()
        self.next_reconcile_at = 0  # 0 = nothing scheduled

    def ensure(self, run_id: str, override: StateOverride | None = None) -> bool:
        """Create the run's terminal message if it needs one and has none (may raise).

        True when the run still needs one: its facts are not there yet.
        """
        store = self.services.store
        if not is_required(run_id, once_terminal=True):
            # A headless run never gets one: read without a transaction (on PostgreSQL one
            # round trip instead of three, and no commit that would outdate the statuses
            # read behind the stop's commit, `run_watch`).
            return False
        with store.transaction():
            if not is_required(run_id) or latest_terminal_message(run_id) is not None:
                return False
            facts = terminal_facts(run_id, override or load_failure_override(run_id))
            if facts is None:
                return True
            record = run_record(run_id)
        # Hooks run outside the transaction: a slow or failing plugin holds no lock.
        fingerprint = terminal_fingerprint(facts)
        instructions = plugins.presentation_instructions(record, facts)
        if not isinstance(instructions, str) or not instructions.strip():
            raise PluginError("piw_presentation_instructions returned no instruction text.")
        quoted: TerminalFacts = {**facts, "terminalFingerprint": fingerprint}
        content = plugins.render_terminal_message(quoted, instructions)
        if not isinstance(content, MessageContent) or not isinstance(content.text, str):
            raise PluginError("piw_render_terminal_message did not return a MessageContent.")
        message_id = terminal_message_id(run_id, fingerprint)
        # The identity and the facts are the core's; a renderer chooses only the wording.
        # The facts are kept bounded: every session view carries them.
        details = {
            **content.details,
            "workflowMessageId": message_id,
            "runId": run_id,
            "kind": "terminal",
            "terminal": bounded_terminal_facts(quoted),
        }
        with store.transaction():
            if latest_terminal_message(run_id) is not None:
                return False  # another path created it while the hooks ran
            assert record.origin_session_id is not None  # is_required: an interactive run
            create_workflow_message(
                run_id=run_id,
                target_session_id=record.origin_session_id,
                kind="terminal",
                source_id=terminal_source_id(run_id),
                idempotency_key=fingerprint,
                content=dataclasses.replace(content, details=details),
            )
        return False

    def try_ensure(self, run_id: str, override: StateOverride | None = None) -> None:
        """`ensure`, but a failure only schedules a retry and logs; never raises."""
        try:
            missing = self.ensure(run_id, override)
        except Exception as error:
            log.warning("terminal workflow message reconciliation failed for %s: %s", run_id, error)
            if self._is_required_or_unknown(run_id):
                self.schedule(run_id)
            return
        if missing:
            self.schedule(run_id)
        else:
            self.pending.discard(run_id)

    def _is_required_or_unknown(self, run_id: str) -> bool:
        try:
            return is_required(run_id)
        except Exception:
            return True  # the database is unreadable right now: keep trying

    def schedule(self, run_id: str) -> None:
        self.pending.add(run_id)
        if self.next_reconcile_at == 0:
            self.next_reconcile_at = now_ms() + RECONCILE_INTERVAL_MS

    @feature_hook
    def piwh_ensure_terminal_message(self, run_id: str) -> None:
        self.try_ensure(run_id)

    @feature_hook
    def piwh_poll(self) -> None:
        self.reconcile()

    def reconcile(self, *, force: bool = False) -> None:
        """Retry every pending run; without `force` at most once per interval."""
        if not self.pending:
            self.next_reconcile_at = 0
            return
        now = now_ms()
        if not force and now < self.next_reconcile_at:
            return
        self.next_reconcile_at = now + RECONCILE_INTERVAL_MS
        for run_id in sorted(self.pending):
            self.try_ensure(run_id)
        if not self.pending:
            self.next_reconcile_at = 0

    @feature_hook
    def piwh_startup(self) -> None:
        self.discover_missing()

    @feature_hook
    def piwh_reconnected(self) -> None:
        # The commit that ended a run may have happened unseen, its message never made.
        self.discover_missing()

    def discover_missing(self) -> None:
        """Startup: every required but missing message, then one forced pass."""
        self.pending.update(runs_missing_terminal_messages())
        self.reconcile(force=True)

    @feature_hook
    def piwh_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        if is_terminal_status(new_status):
            self.try_ensure(run_id)
