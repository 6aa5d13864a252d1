"""Answers over the 1 MiB client frame carry content references that the client reads back
in checked chunks (reference 3.15–3.18, SPEC §7.2/§8): real host, real socket, real CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket

import pytest

from pi_workflows.canonical import canonical_json
from pi_workflows.protocol.client_messages import SCHEMA
from pi_workflows.protocol.framing import MAX_FRAME_BYTES

from .conftest import HostHarness

# About 400 KB of result: three runs make a `run.list` answer of 1.2 MB.
BIG = """
from pi_workflows import compute, workflow

WORKFLOW = workflow(
    name="big",
    start_at="make",
    nodes={"make": compute(lambda ctx: {"n": ctx.input["n"], "rows": ["x" * 100] * 4000})},
    edges=[],
)
"""


def _big_runs(harness: HostHarness, count: int) -> list[str]:
    harness.write_workflow("big", BIG)
    harness.start_host()
    runs = [harness.start_run("big", {"n": n}) for n in range(count)]
    for run_id in runs:
        harness.wait_for_status(run_id, "completed")
    return runs


def _request(sock_file, request_id: str, operation: str, payload: dict) -> dict:
    message = {
        "schema": SCHEMA,
        "type": "request",
        "requestId": request_id,
        "clientId": "content-test",
        "operation": operation,
        "idempotencyKey": request_id,
        "payload": payload,
    }
    sock_file.write(canonical_json(message).encode() + b"\n")
    sock_file.flush()
    while True:
        line = sock_file.readline()
        assert len(line) <= MAX_FRAME_BYTES
        reply = json.loads(line)
        if reply.get("type") == "response":
            return reply


def _references(value: object) -> list[dict]:
    """Every content reference in `value`, in order."""
    if isinstance(value, dict):
        if set(value) == {"$content"}:
            return [value["$content"]]
        return [ref for child in value.values() for ref in _references(child)]
    if isinstance(value, list):
        return [ref for child in value for ref in _references(child)]
    return []


def _raw(harness: HostHarness):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(15)
    sock.connect(str(harness.home.socket_path))
    stream = sock.makefile("rwb")
    assert json.loads(stream.readline())["type"] == "hello"
    return sock, stream


def test_run_list_over_the_frame_limit_arrives_whole(harness: HostHarness):
    runs = _big_runs(harness, 3)
    listed = json.loads(harness.cli("run", "list", "--json").stdout)
    assert sorted(r["runId"] for r in listed) == sorted(runs)
    for status in listed:
        assert status["finalOutput"]["rows"] == ["x" * 100] * 4000


@pytest.mark.scenario("3.17", "3.18")
def test_content_references_are_read_in_checked_chunks_by_their_connection_only(
    harness: HostHarness,
):
    _big_runs(harness, 3)
    sock, stream = _raw(harness)
    other, other_stream = _raw(harness)
    try:
        listed = _request(stream, "list-1", "run.list", {})
        assert listed["outcome"] == "accepted"
        references = _references(listed["receipt"])
        assert references, "the answer should have carried content references"
        reference = references[0]
        assert set(reference) == {"sha256", "bytes"}

        chunks, offset = [], 0
        while offset < reference["bytes"]:
            read = _request(
                stream, f"read-{offset}", "content.read", {**reference, "offset": offset}
            )
            assert read["outcome"] == "accepted", read
            chunks.append(read["receipt"]["chunk"])
            offset = read["receipt"]["nextOffset"]
        assert len(chunks) > 1  # a 400 KB value comes in more than one chunk
        data = b"".join(base64.b64decode(chunk) for chunk in chunks)
        assert hashlib.sha256(data).hexdigest() == reference["sha256"]
        assert json.loads(data) == ["x" * 100] * 4000

        past_end = _request(
            stream, "read-past", "content.read", {**reference, "offset": reference["bytes"] + 1}
        )
        assert past_end["outcome"] == "rejected" and "offset is invalid" in past_end["error"]
        stranger = _request(other_stream, "read-other", "content.read", {**reference, "offset": 0})
        assert stranger["outcome"] == "notFound" and "unavailable" in stranger["error"]
    finally:
        sock.close()
        other.close()


# Five ~460 KB results (2.3 MB of run state), then a node that waits to be released.
LARGE_STATE = """
import os
import time
from pathlib import Path

from pi_workflows import compute, edge, workflow


def big(i):
    return lambda ctx: {"i": i, "rows": ["x" * 100] * 4500}


def hold(ctx):
    (Path.cwd() / "hold.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not (Path.cwd() / "release").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("release never appeared")
        time.sleep(0.02)
    return {"sizes": [len(ctx.outputs[f"n{i}"]["rows"]) for i in range(5)]}


nodes = {f"n{i}": compute(big(i)) for i in range(5)}
nodes["hold"] = compute(hold)
WORKFLOW = workflow(
    name="large-state",
    start_at="n0",
    nodes=nodes,
    edges=[edge(f"n{i}", f"n{i + 1}") for i in range(4)] + [edge("n4", "hold")],
)
"""


@pytest.mark.scenario("3.15")
def test_a_run_with_more_than_2_mib_of_state_resumes_after_its_worker_dies(
    harness: HostHarness,
):
    """Reference 3.15: a resumed worker gets the whole state, however far over 1 MiB."""
    harness.write_workflow("large-state", LARGE_STATE)
    harness.start_host()
    run_id = harness.start_run("large-state")
    first = harness.wait_for_pid("hold.pid")
    os.kill(first, signal.SIGKILL)
    harness.wait_for_pid("hold.pid", previous=first)  # a new worker resumed at `hold`
    (harness.project / "release").touch()

    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {"sizes": [4500] * 5}
    # Each large result is stored once, not again in every later snapshot of the run.
    history = 5 * len(json.dumps({"i": 0, "rows": ["x" * 100] * 4500}))
    ((stored,),) = harness.query("SELECT SUM(byte_length) FROM blobs")
    assert stored < 4 * history, f"{stored} bytes of blobs for {history} bytes of results"


# What a workflow may return that looks like a reference, or like the escape of one.
LOOKALIKES = [
    {"$content": {"sha256": "0" * 64, "bytes": 5}},
    {"$escaped": {"$content": {"sha256": "0" * 64, "bytes": 5}}},
    {"$escaped": 7, "other": [{"$content": None}]},
    {"$content": "text", "$escaped": []},
]
LOOKALIKE = f"""
from pi_workflows import compute, workflow

LOOKALIKES = {LOOKALIKES!r}


def returned(ctx):
    value = {{"lookalikes": LOOKALIKES}}
    if ctx.input.get("big"):  # over a frame: the answer carries references as well
        value["rows"] = [{{"$content": {{"row": "x" * 100}}}}] * 3000
        value["wrapped"] = {{"$content": ["y" * 100] * 300}}
        value["whole"] = {{"$content": "z" * 10000, "b": "z" * 10000}}
    return value


WORKFLOW = workflow(
    name="lookalike", start_at="make", nodes={{"make": compute(returned)}}, edges=[]
)
"""


@pytest.mark.scenario("4.23")
def test_user_values_that_look_like_references_are_listed_as_they_are(harness: HostHarness):
    """A workflow's value is never read as a content reference (issue 22.4): `run status`
    and `run list` show it exactly, also inside an answer that carries real references."""
    harness.write_workflow("lookalike", LOOKALIKE)
    harness.write_workflow("big", BIG)
    harness.start_host()
    small = harness.start_run("lookalike")
    big = harness.start_run("lookalike", {"big": True})  # 400 KB; with the two other
    # 400 KB runs, `run list` is over a frame
    others = [harness.start_run("big", {"n": n}) for n in range(2)]
    for run_id in (small, big, *others):
        harness.wait_for_status(run_id, "completed")

    status = json.loads(harness.cli("run", "status", small, "--json").stdout)
    assert status["finalOutput"] == {"lookalikes": LOOKALIKES}
    listed = {r["runId"]: r for r in json.loads(harness.cli("run", "list", "--json").stdout)}
    assert set(listed) == {small, big, *others}
    assert listed[small]["finalOutput"] == {"lookalikes": LOOKALIKES}
    assert listed[big]["finalOutput"] == {
        "lookalikes": LOOKALIKES,
        "rows": [{"$content": {"row": "x" * 100}}] * 3000,
        "wrapped": {"$content": ["y" * 100] * 300},
        "whole": {"$content": "z" * 10000, "b": "z" * 10000},
    }
    for run_id in others:
        assert listed[run_id]["finalOutput"]["rows"] == ["x" * 100] * 4000
