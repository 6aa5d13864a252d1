"""The client protocol against a real host: receipts, adoption, conflicts, bad frames."""

from __future__ import annotations

import json
import socket

import pytest

from pi_workflows.client import HostConnection
from pi_workflows.client.start_request import start_payload
from pi_workflows.protocol.client_messages import SCHEMA
from pi_workflows.protocol.framing import FrameError, encode_frame

from .conftest import HostHarness, wait_until
from .workflows import BLOCKER


def _start_payload(harness: HostHarness, name: str = "hello") -> dict:
    return start_payload("hello", harness.project, {"name": name})


@pytest.mark.scenario("4.7", "4.8", "4.9")
def test_repeated_request_id_and_idempotency_key_adopt_the_stored_receipt(harness: HostHarness):
    harness.start_host()
    with HostConnection(harness.home.socket_path) as connection:
        payload = _start_payload(harness)
        first = connection.request("run.start", payload, request_id="r-1", idempotency_key="k-1")
        again = connection.request("run.start", payload, request_id="r-1", idempotency_key="k-1")
        by_key = connection.request("run.start", payload, request_id="r-2", idempotency_key="k-1")
        assert first.outcome == "accepted"
        assert again.outcome == "adopted" and by_key.outcome == "adopted"
        assert first.receipt == again.receipt == by_key.receipt
        changed = _start_payload(harness, name="Grace")
        key_conflict = connection.request(
            "run.start", changed, request_id="r-3", idempotency_key="k-1"
        )
        id_conflict = connection.request(
            "run.start", changed, request_id="r-1", idempotency_key="k-9"
        )
        assert key_conflict.outcome == "conflict"
        assert "Idempotency key was reused" in key_conflict.error
        assert id_conflict.outcome == "conflict"
        assert "Request ID was reused" in id_conflict.error
    runs = harness.query("SELECT run_id FROM runs")
    assert runs == [(first.receipt["runId"],)]


@pytest.mark.scenario("4.8")
def test_a_new_client_with_the_same_request_id_still_adopts(harness: HostHarness):
    harness.start_host()
    payload = _start_payload(harness)
    with HostConnection(harness.home.socket_path) as one:
        first = one.request("run.start", payload, request_id="same", idempotency_key="same")
    with HostConnection(harness.home.socket_path) as two:
        two.client_id = one.client_id  # a restarted client keeps its id and request ids
        second = two.request("run.start", payload, request_id="same", idempotency_key="same")
    assert second.outcome == "adopted"
    assert second.receipt["runId"] == first.receipt["runId"]


def _raw_connection(harness: HostHarness) -> tuple[socket.socket, object]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(harness.home.socket_path))
    reader = sock.makefile("rb")
    hello = json.loads(reader.readline())
    assert hello["type"] == "hello" and hello["schema"] == SCHEMA
    return sock, reader


@pytest.mark.scenario("4.2")
def test_malformed_and_oversize_frames_close_only_that_connection(harness: HostHarness):
    harness.start_host()
    with HostConnection(harness.home.socket_path) as bystander:
        bad, bad_reader = _raw_connection(harness)
        bad.sendall(b"{this is not json\n")
        assert bad_reader.readline() == b""  # closed by the host
        bad.close()

        big, big_reader = _raw_connection(harness)
        big.sendall(b'{"x":"' + b"a" * (1024 * 1024 + 10) + b'"}\n')
        assert big_reader.readline() == b""
        big.close()

        odd, odd_reader = _raw_connection(harness)
        odd.sendall(
            json.dumps(
                {
                    "schema": SCHEMA,
                    "type": "request",
                    "requestId": "q-1",
                    "clientId": "c",
                    "operation": "run.explode",
                    "idempotencyKey": "q-1",
                    "payload": {},
                }
            ).encode()
            + b"\n"
        )
        reply = json.loads(odd_reader.readline())
        assert reply["outcome"] == "rejected" and "Unknown operation" in reply["error"]
        odd.close()

        status = bystander.request("host.status")
        assert status.outcome == "accepted"
        assert status.receipt["state"] == "running"


def test_unknown_run_is_not_found(harness: HostHarness):
    harness.start_host()
    with HostConnection(harness.home.socket_path) as connection:
        reply = connection.request("run.status", {}, run_id="no-such-run")
    assert reply.outcome == "notFound"
    assert "does not exist" in reply.error


def test_any_json_spelling_is_read_canonically_and_duplicate_keys_are_refused(
    harness: HostHarness,
):
    """SPEC §6/§8: the host reads JSON and works on its canonical form, so a client's
    spacing, key order or number spelling never changes a fingerprint; a duplicate key,
    whose meaning depends on the parser, closes the connection."""
    harness.start_host()
    payload = _start_payload(harness)
    loose, reader = _raw_connection(harness)
    request = {
        "payload": payload,
        "idempotencyKey": "spelled-loosely",
        "operation": "run.start",
        "clientId": "loose-client",
        "requestId": "loose-1",
        "type": "request",
        "schema": SCHEMA,
    }
    loose.sendall(json.dumps(request, indent=1).replace("\n", " ").encode() + b"\n")
    first = json.loads(reader.readline())
    assert first["outcome"] == "accepted", first
    with HostConnection(harness.home.socket_path) as canonical:
        canonical.client_id = "loose-client"
        again = canonical.request(
            "run.start", payload, request_id="canonical-2", idempotency_key="spelled-loosely"
        )
    assert again.outcome == "adopted" and again.receipt == first["receipt"]

    frame = json.dumps(request).replace(
        '"requestId": "loose-1"', '"requestId": "a", "requestId": "b"'
    )
    loose.sendall(frame.encode() + b"\n")
    assert reader.readline() == b""  # closed
    loose.close()
    assert harness.query("SELECT count(*) FROM runs") == [(1,)]


@pytest.mark.scenario("4.10", "5.6")
def test_a_stored_cancel_or_refusal_is_replayed_to_its_repeat(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    with HostConnection(harness.home.socket_path) as connection:
        started = connection.request("run.start", _start_payload(harness))
        run_id = started.receipt["runId"]
        harness.wait_for_status(run_id, "completed")

        # A refusal is stored: the same key under a new request id hears it again.
        refused = connection.request(
            "run.cancel", {}, run_id=run_id, request_id="cancel-1", idempotency_key="cancel"
        )
        assert refused.outcome == "rejected" and "already terminal" in refused.error
        replayed = connection.request(
            "run.cancel", {}, run_id=run_id, request_id="cancel-2", idempotency_key="cancel"
        )
        assert (replayed.outcome, replayed.error) == ("rejected", refused.error)
        assert harness.query(
            "SELECT request_id, outcome FROM host_commands WHERE idempotency_key = 'cancel'"
        ) == [("cancel-1", "rejected")]

        # A cancel that went through: its identical repeat adopts the stored receipt.
        queued = connection.request(
            "run.start", start_payload("blocker", harness.project, None)
        ).receipt["runId"]
        first = connection.request(
            "run.cancel", {}, run_id=queued, request_id="stop-1", idempotency_key="stop"
        )
        again = connection.request(
            "run.cancel", {}, run_id=queued, request_id="stop-1", idempotency_key="stop"
        )
    assert first.outcome == "accepted"
    assert first.receipt == {"runId": queued, "status": "cancelled"}
    assert (again.outcome, again.receipt) == ("adopted", first.receipt)
    assert harness.query(
        "SELECT COUNT(*) FROM events WHERE run_id = ? AND event_type = 'run.queue_cancelled'",
        queued,
    ) == [(1,)]


def _padded_status(size: int) -> bytes:
    """A host.status frame of exactly `size` bytes, newline included."""
    frame = {
        "schema": SCHEMA,
        "type": "request",
        "requestId": "padded",
        "clientId": "padding-client",
        "operation": "host.status",
        "idempotencyKey": "padded",
        "payload": {},
        "pad": "",
    }
    bare = len(encode_frame(frame))
    return encode_frame({**frame, "pad": "x" * (size - bare)})


@pytest.mark.scenario("4.3")
def test_the_frame_limit_counts_the_newline(harness: HostHarness):
    limit = 1024 * 1024
    at_limit = _padded_status(limit)
    assert len(at_limit) == limit and at_limit.endswith(b"\n")
    with pytest.raises(FrameError, match="exceeds 1 MiB"):
        _padded_status(limit + 1)  # the client refuses to encode one byte more

    harness.start_host()
    fits, reader = _raw_connection(harness)
    fits.sendall(at_limit)
    answer = json.loads(reader.readline())  # read and answered, not closed
    assert answer["requestId"] == "padded", answer
    fits.close()
    over, over_reader = _raw_connection(harness)
    # One byte more: the frame without its newline already reaches the limit.
    over.sendall(at_limit[:-1] + b" \n")
    assert over_reader.readline() == b""
    over.close()

    not_object, not_object_reader = _raw_connection(harness)
    not_object.sendall(b"[]\n")
    assert not_object_reader.readline() == b""
    not_object.close()
    wait_until(
        lambda: "Protocol message must be a JSON object" in harness.host_log(),
        what="the host to log why it closed the connection",
    )
