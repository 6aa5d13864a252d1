"""The `webhook` decision channel: signed POSTs out, signed answers in (127.0.0.1 only)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from pi_workflows.plugin import ChannelConfigError, ChannelDeliveryError, hookimpl

if TYPE_CHECKING:
    from http.server import BaseHTTPRequestHandler

SIGNATURE_HEADER = "X-Pi-Workflows-Signature"
TIMESTAMP_HEADER = "X-Pi-Workflows-Timestamp"
MAX_SKEW_S = 300
MAX_ANSWER_BYTES = 64 * 1024


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` HMAC of `<timestamp>.<body>`; both directions use it."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class WebhookChannel:
    def __init__(self, context: Any) -> None:
        self.context = context
        options = context.options
        if not isinstance(options.get("url"), str):
            raise ChannelConfigError(f"Webhook channel {context.name!r} needs a 'url'.")
        if "secret" not in context.credentials:
            raise ChannelConfigError(
                f"Webhook channel {context.name!r} needs 'secret_file' (a 0600 file)."
            )
        self.url = options["url"]
        self.timeout_s = float(options.get("timeout_s", 10))
        self._secret = context.credentials["secret"]
        self._nonces: dict[str, float] = {}
        self._lock = threading.Lock()
        # Imported here, as in _post: every pi-workflows process loads this plugin, and
        # only a host with a webhook channel configured serves or posts anything.
        from http.server import ThreadingHTTPServer

        self.server = ThreadingHTTPServer(
            ("127.0.0.1", int(options.get("listen_port", 0))), _handler_for(self)
        )
        self.server.daemon_threads = True
        port = self.server.server_address[1]
        self.answer_url = f"http://127.0.0.1:{port}/answers"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    # --- outbound ------------------------------------------------------------------------

    def deliver(self, request: dict[str, Any]) -> dict[str, Any]:
        body = {"type": "decision.request", "request": request, "answerUrl": self.answer_url}
        return self._post(body)

    def settle(
        self, request: dict[str, Any], resolution: dict[str, Any], delivery: Any
    ) -> dict[str, Any]:
        winner = {key: resolution.get(key) for key in ("provenance", "response", "resolvedAt")}
        body = {
            "type": "decision.settled",
            "decisionId": request["decisionId"],
            "resolution": winner,
        }
        return self._post(body)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        data = json.dumps(body, sort_keys=True).encode()
        timestamp = str(int(time.time()))
        request = urllib.request.Request(
            self.url,
            data=data,
            method="POST",
            headers={
                "Content-Type": "application/json",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: sign(self._secret, timestamp, data),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return {"status": reply.status}
        except urllib.error.HTTPError as error:
            raise ChannelDeliveryError(f"webhook answered HTTP {error.code}") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, ConnectionRefusedError):
                raise ChannelDeliveryError("webhook refused the connection") from None
            raise  # anything else may or may not have arrived: the host marks it ambiguous

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- inbound answers -----------------------------------------------------------------

    def handle_answer(self, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        timestamp = headers.get(TIMESTAMP_HEADER) or ""
        signature = headers.get(SIGNATURE_HEADER) or ""
        if not hmac.compare_digest(sign(self._secret, timestamp, body), signature):
            return 401, {"error": "The answer signature does not verify."}
        if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > MAX_SKEW_S:
            return 401, {"error": f"The answer timestamp is more than {MAX_SKEW_S} s off."}
        try:
            answer = json.loads(body)
            decision_id, choice = answer["decisionId"], answer["choice"]
            actor, nonce = answer["actor"], answer["nonce"]
        except (ValueError, KeyError, TypeError):
            return 400, {"error": "An answer is {decisionId, choice, input?, actor, nonce}."}
        if not all(isinstance(v, str) and v for v in (decision_id, choice, actor, nonce)):
            return 400, {"error": "decisionId, choice, actor and nonce must be strings."}
        if not self._first_use(nonce, int(timestamp)):
            return 409, {"error": "This answer was already received (replayed nonce)."}
        if not self.context.settings.allows(actor):
            return 403, {"error": f"Actor {actor!r} may not answer through this channel."}
        result = self.context.report_answer(decision_id, choice, answer.get("input"), actor=actor)
        status = {"accepted": 200, "adopted": 200, "conflict": 409}.get(result["outcome"], 400)
        return status, result

    def _first_use(self, nonce: str, timestamp: int) -> bool:
        # Nonces older than the skew window can be forgotten: their timestamp is refused.
        with self._lock:
            horizon = time.time() - 2 * MAX_SKEW_S
            for seen, stamp in list(self._nonces.items()):
                if stamp < horizon:
                    del self._nonces[seen]
            if nonce in self._nonces:
                return False
            self._nonces[nonce] = timestamp
            return True


def _handler_for(channel: WebhookChannel) -> type[BaseHTTPRequestHandler]:
    from http.server import BaseHTTPRequestHandler

    class AnswerHandler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/answers" or not 0 < length <= MAX_ANSWER_BYTES:
                self._reply(404 if self.path != "/answers" else 400, {"error": "Bad request."})
                return
            try:
                status, body = channel.handle_answer(self.headers, self.rfile.read(length))
            except Exception as error:  # the host is stopping or did not answer in time
                status, body = 503, {"error": f"The workflow host is unavailable: {error}"}
            self._reply(status, body)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # answers carry actor names; keep them out of the host's stderr

    return AnswerHandler


@hookimpl
def piw_register_decision_channels(register: Any) -> None:
    register("webhook", WebhookChannel)
