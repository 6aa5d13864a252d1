"""Operator recovery of effects in doubt (SPEC §7.4a), a host feature.

Operations: ``effects.list`` (query) and ``effects.confirm`` / ``effects.retry``
(durable, with receipts). Run effects and the channel effects of decisions are resolved
the same way; a run whose last effect in doubt is resolved becomes claimable again.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError
from ..protocol.client_messages import ClientRequest
from ..protocol.framing import valid_id
from ..storage import effects
from .features import feature_hook
from .operations import OperationTable
from .receipts import OperationResult
from .services import HostServices


class EffectRecovery:
    def __init__(self, services: HostServices) -> None:
        self.services = services

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_query("effects.list", self.list)
        operations.register_durable("effects.confirm", self.confirm)
        operations.register_durable("effects.retry", self.retry)

    def list(self, request: ClientRequest) -> list[dict[str, Any]]:
        payload = request.payload
        run_id = payload.get("runId")
        if run_id is not None and not valid_id(run_id):
            raise InvalidInputError("payload.runId must be a run id.")
        return effects.list_effects(status=payload.get("status"), run_id=run_id)

    def confirm(self, request: ClientRequest) -> OperationResult:
        return self._resolve(request, "confirm", request.payload.get("result"))

    def retry(self, request: ClientRequest) -> OperationResult:
        return self._resolve(request, "retry", None)

    def _resolve(self, request: ClientRequest, action: str, result: Any) -> OperationResult:
        effect_id = request.payload.get("effectId")
        if not valid_id(effect_id):
            raise InvalidInputError("payload.effectId must name an effect.")
        receipt = effects.resolve(effect_id, action, result, f"client:{request.client_id}")
        run_id = receipt["runId"]
        if receipt["runReleased"]:
            self.services.unblock_run(run_id)
        return OperationResult(
            "accepted", receipt=receipt, revision=receipt.get("revision"), run_id=run_id
        )
