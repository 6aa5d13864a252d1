"""Retention, a host feature: `state.prune` and the automatic daily sweep.

`state.prune` (payload ``{before, apply, backupPath?}``) prunes finished lineages
(`storage.retention`) and answers with the prune report as its receipt; the receipt is
stored, so a repeat with the same idempotency key adopts it instead of pruning again (a
repeat that comes while the first still runs waits for it). The prune runs one bounded
transaction at a time on the host's loop, so other clients are served between them, and
after each it sends the counts so far to the requesting connection (a `prune_progress`
event whose subscription id is the request id).

The sweep: when the host is idle (no worker running) and the sweep period has passed, the
duty host (every SQLite host) prunes what finished longer than `retention` ago, then
VACUUMs SQLite when enough of the file is free. A failed sweep is logged once and waits for
the next period; `host status` shows the last sweep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..clock import now_ms
from ..durations import duration_ms, parse_before
from ..errors import InvalidInputError
from ..protocol.client_messages import SCHEMA, ClientRequest, response
from ..protocol.framing import one_line_error
from ..storage.maintenance import state_backup, vacuum_if_worthwhile
from ..storage.retention import PruneReport, prune_batches
from .features import feature_hook
from .operations import OperationTable
from .receipts import OperationResult, adopt, execute_durable
from .services import HostServices

log = logging.getLogger("pi_workflows.host")

#: A failed sweep is tried again after this long at the latest (sooner if the period is).
FAILED_SWEEP_RETRY_S = 3600.0


class Retention:
    def __init__(self, services: HostServices) -> None:
        self.services = services
        self.retention_ms = duration_ms(services.settings.text("retention"))
        self.period_s = services.settings.number("retention_sweep_s")
        self.next_sweep_at = 0.0  # time.monotonic(): the first idle tick sweeps
        self.sweeping = False
        self.last_sweep: dict[str, Any] | None = None
        # `state.prune` requests running now, by (client id, idempotency key): done once
        # the request has its answer.
        self.in_flight: dict[tuple[str, str], asyncio.Event] = {}

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_live("state.prune", self.prune_command)

    @feature_hook
    def piwh_host_status(self) -> dict[str, Any]:
        return {"lastPrune": self.last_sweep}

    # --- state.prune -------------------------------------------------------------------

    async def prune_command(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        key = (request.client_id, request.idempotency_key)
        running = self.in_flight.get(key)
        if running is not None:  # a retry (its connection timed out): the first's receipt
            await running.wait()
        adopted = adopt(request)
        if adopted is not None:
            return adopted
        before, apply, backup_path = _prune_payload(request.payload)
        done = self.in_flight[key] = asyncio.Event()
        try:
            report = await self._prune(before, apply, backup_path, _progress(request, connection))
            if self.services.is_stopping:  # cut short: no receipt, a retry prunes the rest
                return response(
                    request.request_id, "unavailable", error="Workflow host is stopping"
                )
            return execute_durable(
                self.services.store,
                request,
                self.services.host_epoch,
                lambda: OperationResult("accepted", receipt=report.as_json()),
            )
        finally:
            del self.in_flight[key]
            done.set()

    async def _prune(
        self,
        before: int,
        apply: bool,
        backup_path: Path | None,
        progress: Callable[[PruneReport], None] | None = None,
    ) -> PruneReport:
        store = self.services.store
        report = PruneReport(before=before, applied=apply)
        if backup_path is not None:
            report.backup = state_backup(store, backup_path)
        for _ in prune_batches(store, report):
            if self.services.is_stopping:
                break  # what is left waits for the next host's sweep
            if progress is not None:
                progress(report)
            await asyncio.sleep(0)  # let the loop serve others between transactions
        return report

    # --- the sweep ---------------------------------------------------------------------

    @feature_hook
    def piwh_poll(self) -> None:
        services = self.services
        if self.retention_ms == 0 or self.sweeping or time.monotonic() < self.next_sweep_at:
            return
        if not services.is_duty_host or services.worker_load()[0] > 0:
            return
        self.sweeping = True
        services.spawn(self._sweep(now_ms() - self.retention_ms))

    async def _sweep(self, before: int) -> None:
        started = now_ms()
        try:
            report = await self._prune(before, True, None)
            vacuumed = vacuum_if_worthwhile(self.services.store)
        except Exception as error:
            self.next_sweep_at = time.monotonic() + min(self.period_s, FAILED_SWEEP_RETRY_S)
            self.last_sweep = {"at": started, "outcome": "failed", "error": one_line_error(error)}
            log.warning("automatic state prune failed: %s", one_line_error(error))
            return
        finally:
            self.sweeping = False
        self.next_sweep_at = time.monotonic() + self.period_s
        self.last_sweep = {
            "at": started,
            "outcome": "completed",
            "durationMs": now_ms() - started,
            **report.as_json(),
            "vacuumed": vacuumed,
        }
        log.info(
            "automatic state prune completed: %d runs, %d blobs, %d bytes%s",
            report.runs,
            report.blobs,
            report.bytes,
            ", vacuumed" if vacuumed else "",
        )


def _progress(request: ClientRequest, connection: Any) -> Callable[[PruneReport], None]:
    """Sends the counts so far to the connection that asked for the prune."""

    def send(report: PruneReport) -> None:
        connection.push(
            {
                "schema": SCHEMA,
                "type": "event",
                "subscriptionId": request.request_id,
                "event": "prune_progress",
                "payload": report.as_json(),
            },
            replaces=request.request_id,  # counts so far: only the latest is worth sending
        )

    return send


def _prune_payload(payload: dict[str, Any]) -> tuple[int, bool, Path | None]:
    """`{before, apply, backupPath?}` checked: the cut-off in epoch ms, apply, the backup."""
    apply = payload.get("apply")
    if type(apply) is not bool:
        raise InvalidInputError("payload.apply must be true or false")
    backup = payload.get("backupPath")
    if backup is not None and (not isinstance(backup, str) or not Path(backup).is_absolute()):
        raise InvalidInputError("payload.backupPath must be an absolute path")
    return parse_before(payload.get("before")), apply, Path(backup) if backup else None
