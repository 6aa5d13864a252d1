"""Worker fencing and the run-command rules of SPEC §7.3, through real worker launches."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from pi_workflows.client import HostConnection
from pi_workflows.client.start_request import start_payload
from pi_workflows.errors import HostUnavailableError
from pi_workflows.storage.models import Lease, Run
from pi_workflows.storage.runs import create_run
from pi_workflows.testing.host import TERMINAL_STATUSES

from .conftest import HostHarness, wait_until
from .workflows import (
    CHECKPOINTED,
    GATED_IMPORT,
    RESENDING_WORKER_PLUGIN,
    STALE_LAUNCH_PLUGIN,
    STEPS,
)

# worker.ready keeps no replay record (it is a read), so the commands the host answered
# are logged by a plugin wrapping the built-in launch hook.
COMMAND_LOG_PLUGIN = """
import json
import os

from pi_workflows import hookimpl


@hookimpl(wrapper=True)
def piw_worker_run_command(record, resume_interaction_attempt_id):
    command = yield
    with open(os.environ["COMMAND_LOG"], "a") as log:
        log.write(json.dumps({"runId": record.run_id, "command": command.to_json()}) + "\\n")
    return command
"""


def _start_logging_host(harness: HostHarness, tmp_path: Path) -> None:
    (tmp_path / "command_log.py").write_text(COMMAND_LOG_PLUGIN)
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="command_log",
        COMMAND_LOG=str(tmp_path / "commands.jsonl"),
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )


def _ready_commands(tmp_path: Path, run_id: str) -> list[dict]:
    """The `command` the host answered to each worker.ready of the run, oldest first."""
    log = tmp_path / "commands.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    entries = [json.loads(line) for line in lines]
    return [entry["command"] for entry in entries if entry["runId"] == run_id]


def _diagnostics(harness: HostHarness, run_id: str) -> str:
    rows = harness.query(
        "SELECT b.content FROM run_workers w JOIN blobs b ON b.blob_hash = w.diagnostic_hash "
        "WHERE w.run_id = ?",
        run_id,
    )
    return "\n".join(bytes(row[0]).decode() for row in rows)


@pytest.mark.scenario("2.1", "2.2", "2.12", "2.14", "A.2")
def test_a_stale_worker_gets_claim_lost_and_writes_nothing(harness: HostHarness, tmp_path: Path):
    (tmp_path / "stale_launch.py").write_text(STALE_LAUNCH_PLUGIN)
    harness.write_workflow("steps", STEPS)
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="stale_launch",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    run_id = harness.start_run("steps")
    first = harness.wait_for_pid("b.pid")
    revision_before = harness.query("SELECT revision FROM runs WHERE run_id = ?", run_id)[0][0]
    (harness.project / "stale-next").touch()
    os.kill(first, signal.SIGKILL)

    wait_until(lambda: "Worker epoch is stale" in _diagnostics(harness, run_id), what="claimLost")
    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workerNoProgress",
        what="the stale launch to be parked",
    )
    # Between the crash and the refusal only host bookkeeping changed the run: the
    # crashed worker's park, the new claim, and the no-progress park.
    events = harness.query(
        "SELECT event_type FROM events WHERE run_id = ? AND revision > ? ORDER BY revision",
        run_id,
        revision_before,
    )
    assert [e[0] for e in events] == [
        "run.queue_parked",
        "lease.claimed",
        "run.worker_no_progress",
    ]
    generations = [w[0] for w in harness.workers(run_id)]
    assert generations == sorted(generations) and len(generations) == 2

    harness.cli("run", "resume", run_id)
    harness.wait_for_pid("b.pid", previous=first)
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"sum": 3}


@pytest.mark.scenario("2.2")
def test_a_start_answered_at_launch_runs_no_node_once_its_claim_is_lost(
    harness: HostHarness, tmp_path: Path
):
    harness.write_workflow("gated", GATED_IMPORT)
    _start_logging_host(harness, tmp_path)
    run_id = harness.start_run("gated")
    harness.wait_for_pid("import.pid")
    # The worker is still importing, before worker.ready: its command was chosen already,
    # the answer went with the launch.
    wait_until(lambda: _ready_commands(tmp_path, run_id), what="the command chosen at launch")
    store = harness.open_store()
    try:
        # The claim's generation moves on (the heartbeat still renews it: only the fence
        # at worker.ready and at the first write can see the claim is gone).
        with store.transaction():
            Lease.update(generation=Lease.generation + 1).where(Lease.run == run_id).execute()
    finally:
        store.close()
    (harness.project / "release-import").touch()

    wait_until(lambda: "Run claim expired" in _diagnostics(harness, run_id), what="claimLost")
    wait_until(lambda: harness.workers(run_id)[0][1] == "claimLost", what="the worker to stop")
    assert not (harness.project / "trace").exists()  # node a never ran
    events = harness.query("SELECT event_type FROM events WHERE run_id = ?", run_id)
    assert not [e for (e,) in events if "node" in e], events
    assert [c["kind"] for c in _ready_commands(tmp_path, run_id)] == ["start"]


@pytest.mark.integration  # a host process of its own: the test's write is another process's
@pytest.mark.scenario("2.2")
@pytest.mark.parametrize("moved", ["claim", "revision"])
def test_a_run_moved_on_between_two_writes_refuses_the_second_as_a_read_would(
    harness: HostHarness, moved: str
):
    # The worker's writes after its first check the claim and the revision with their
    # next statement (PostgreSQL: the host knows what they should find). A failed check
    # is answered as the read answers it (the claim lost, or a revision conflict, not
    # the host's lease, whose check travels with it), and nothing of the write is written.
    harness.write_workflow("steps", STEPS)
    host = harness.start_host()
    run_id = harness.start_run("steps")
    harness.wait_for_pid("b.pid")  # node a finished and b started: two writes
    revision = harness.query("SELECT revision FROM runs WHERE run_id = ?", run_id)[0][0]
    store = harness.open_store()
    try:
        with store.transaction():
            if moved == "claim":
                Lease.update(generation=Lease.generation + 1).where(Lease.run == run_id).execute()
            else:  # another writer's change
                Run.update(revision=Run.revision + 1).where(Run.run_id == run_id).execute()
    finally:
        store.close()
    (harness.project / "release-b").touch()

    if moved == "claim":
        wait_until(lambda: "Run claim expired" in _diagnostics(harness, run_id), what="claimLost")
        wait_until(lambda: harness.workers(run_id)[0][1] == "claimLost", what="the worker to stop")
    else:
        conflict = f"revision conflict: expected {revision}, got {revision + 1}"
        wait_until(lambda: conflict in _diagnostics(harness, run_id), what="the conflict")
        wait_until(lambda: harness.workers(run_id)[0][1] == "crashed", what="the worker to stop")
    # Node b's end was not written by that worker.
    events = harness.query(
        "SELECT event_type FROM events WHERE run_id = ? AND revision = ?", run_id, revision + 1
    )
    assert events in ([], [("run.queue_parked",)]), events
    # The loss was the run's alone: the same host goes on serving.
    again = harness.start_run("hello", {"name": "after"})
    assert harness.wait_for_status(again, "completed")["status"] == "completed"
    assert host.poll() is None


def test_an_answer_at_launch_larger_than_the_pipe_reaches_the_worker_whole(
    harness: HostHarness,
):
    harness.start_host()
    # The answer carries the input twice (the command and the run state): far more than
    # a pipe holds before the worker reads, so the rest follows once the worker reads.
    name = "x" * 400_000
    client = harness.client()
    try:
        run_id = client.start_run(start_payload("hello", harness.project, {"name": name}))["runId"]
    finally:
        client.close()
    final = harness.wait_for_status(run_id, "completed")["finalOutput"]
    assert final == {"greeting": f"Hello, {name}!"}


def test_start_and_resume_commands(harness: HostHarness, tmp_path: Path):
    harness.write_workflow("steps", STEPS)
    _start_logging_host(harness, tmp_path)
    run_id = harness.start_run("steps")
    first = harness.wait_for_pid("b.pid")
    os.kill(first, signal.SIGKILL)
    harness.wait_for_pid("b.pid", previous=first)
    (harness.project / "release-b").touch()
    harness.wait_for_status(run_id, "completed")
    commands = _ready_commands(tmp_path, run_id)
    assert [c["kind"] for c in commands] == ["start", "resume"]
    assert commands[0]["input"] == {}


def _derived_run(harness: HostHarness, parent_id: str | None, **lineage) -> str:
    """Insert a run derived from `parent_id` straight into the state, as the host would."""
    store = harness.open_store()
    try:
        template = Run.get_by_id(parent_id or lineage.pop("template"))
        run_id = f"derived-{os.urandom(4).hex()}"
        with store.transaction():
            create_run(
                run_id=run_id,
                workflow_name=template.workflow_name,
                workflow_ref=template.workflow_ref,
                workflow_source=json.loads(template.workflow_source),
                definition_digest=template.definition_digest,
                project_path=template.project_path,
                input=lineage.pop("input", {}),
                actor="test",
                parent_run_id=parent_id,
                root_run_id=template.root_run_id,
                **lineage,
            )
        return run_id
    finally:
        store.close()


@pytest.mark.scenario("3.3", "8.11")
def test_restart_command_starts_the_same_definition_again(harness: HostHarness, tmp_path: Path):
    _start_logging_host(harness, tmp_path)
    parent = harness.start_run("hello", {"name": "Ada"})
    harness.wait_for_status(parent, "completed")
    child = _derived_run(
        harness,
        parent,
        lineage_kind="restart",
        restart_number=1,
        parent_terminal_fingerprint="f" * 64,
        input={"name": "Ada"},
    )
    status = harness.wait_for_status(child, "completed")
    assert status["finalOutput"] == {"greeting": "Hello, Ada!"}
    assert [c["kind"] for c in _ready_commands(tmp_path, child)] == ["restart"]


@pytest.mark.scenario("3.4", "9.1")
def test_continue_command_carries_the_parent_and_input(harness: HostHarness, tmp_path: Path):
    harness.write_workflow("checkpointed", CHECKPOINTED)
    _start_logging_host(harness, tmp_path)
    parent = harness.start_run("checkpointed")
    harness.wait_for_status(parent, "waiting")
    child = _derived_run(harness, parent, lineage_kind="continuation", input={"ok": True})
    status = harness.wait_for_status(child, "completed")
    assert status["finalOutput"] == {"answer": {"ok": True}}
    (command,) = _ready_commands(tmp_path, child)
    assert command == {"kind": "continue", "parentRunId": parent, "input": {"ok": True}}


@pytest.mark.parametrize(
    ("lineage", "message"),
    [
        ({"lineage_kind": "continuation"}, "has no parent run"),
        ({"lineage_kind": None}, "has a parent without a lineage kind"),
    ],
)
@pytest.mark.scenario("A.1")
def test_run_command_errors_fail_the_launch(harness: HostHarness, lineage: dict, message: str):
    harness.start_host()
    template = harness.start_run("hello")
    harness.wait_for_status(template, "completed")
    if lineage["lineage_kind"] == "continuation":
        run_id = _derived_run(harness, None, template=template, **lineage)
    else:
        run_id = _derived_run(harness, template, **lineage)
    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workerNoProgress",
        what="the failed launch to be parked",
    )
    assert message in _diagnostics(harness, run_id)
    assert [w[1] for w in harness.workers(run_id)] == ["crashed"]


def test_a_worker_whose_goodbye_rode_on_its_last_write_exits_cleanly(harness: HostHarness):
    harness.write_workflow("checkpointed", CHECKPOINTED)
    harness.start_host()
    completed = harness.start_run("hello", input={"name": "Ada"})
    waiting = harness.start_run("checkpointed")
    assert harness.wait_for_status(completed, "completed")["finalOutput"] == {
        "greeting": "Hello, Ada!"
    }
    harness.wait_for_status(waiting, "waiting")
    # The last write (run.completed, run.waiting) carried worker.exiting: the host saw
    # the goodbye, so each worker's exit is recorded clean, not as a crash.
    for run_id in (completed, waiting):
        wait_until(
            lambda run_id=run_id: [w[1] for w in harness.workers(run_id)] == ["exited"],
            what="the worker's clean exit",
        )


# A worker that speaks the protocol by hand: it reads its run state, sends a settlement
# whose refusal would quote 2 MiB, then asks for the whole-run read the protocol no longer has.
RAW_WORKER_PLUGIN = '''
import dataclasses
import sys

from pi_workflows import hookimpl
from pi_workflows.builtin import launch

CODE = """
import json, os, sys
from pi_workflows.worker.host_pipe import HostPipe

envelope = json.loads(os.environ["PI_WORKFLOWS_WORKER_LAUNCH"])
pipe = HostPipe(envelope, sys.stdin.buffer, sys.stdout.buffer)
pipe.ready()
state = pipe.call("store.readRunState", {})
try:
    pipe.call("store.settleEffect", {"settlement": {"effectId": "e", "outcome": "x" * 2**21}})
    refusal = None
except Exception as error:
    refusal = str(error)
with open("read-state.json", "w") as out:
    json.dump({"state": sorted(state), "refusal": refusal}, out)
pipe.call("store.readRun", {})
"""


@hookimpl
def piw_worker_process(envelope, settings):
    spec = launch.piw_worker_process(envelope, settings)
    return dataclasses.replace(spec, argv=[sys.executable, "-c", CODE])
'''


@pytest.mark.scenario("3.19", "3.20")
def test_a_huge_refusal_is_bounded_and_the_removed_whole_run_read_stops_its_worker(
    harness: HostHarness,
):
    harness.add_plugin("raw_worker", RAW_WORKER_PLUGIN)
    harness.start_host()
    run_id = harness.start_run("hello")

    wait_until(
        lambda: "Unknown worker operation 'store.readRun'" in _diagnostics(harness, run_id),
        what="the host to refuse store.readRun",
    )
    answers = json.loads((harness.project / "read-state.json").read_text())
    # store.readRunState is an operation: it was answered with the run's state.
    assert "state" in answers["state"]
    # The refusal that would have quoted 2 MiB came back as one bounded line.
    assert answers["refusal"].startswith("Unknown effect settlement 'xxx")
    assert len(answers["refusal"]) <= 1000 and answers["refusal"].endswith("...")
    wait_until(lambda: harness.workers(run_id)[0][1] == "crashed", what="the worker to stop")
    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workerNoProgress",
        what="the run to be parked: its worker made no progress",
    )


# A worker that grows its run state to just under a pipe line (64 MiB), asks for it back
# with the run's input (a longer line), and ends the run with what it heard.
BIG_STATE_WORKER_PLUGIN = '''
import dataclasses
import sys

from pi_workflows import hookimpl
from pi_workflows.builtin import launch

CODE = """
import json, os, sys
from pi_workflows.worker.host_pipe import HostPipe

envelope = json.loads(os.environ["PI_WORKFLOWS_WORKER_LAUNCH"])
pipe = HostPipe(envelope, sys.stdin.buffer, sys.stdout.buffer)
pipe.ready()


def snapshot(status, event, **fields):
    state = {"schema": "pi-workflows.run-state.v1", "runId": envelope["runId"], "steps": []}
    return {"snapshot": {**state, "status": status, **fields}, "trace_event": {"type": event}}


big = {"big": "x" * (64 * 2**20 - 200 * 2**10)}
pipe.call("store.writeSnapshot", snapshot("running", "run.started", outputs=big))
try:
    pipe.call("store.readRunState", {})
    heard = "the whole state"
except Exception as error:
    heard = str(error)
pipe.call("store.writeSnapshot", snapshot("failed", "run.failed", error=heard))
"""


@hookimpl
def piw_worker_process(envelope, settings):
    spec = launch.piw_worker_process(envelope, settings)
    return dataclasses.replace(spec, argv=[sys.executable, "-c", CODE])
'''


@pytest.mark.integration
@pytest.mark.sqlite_only
@pytest.mark.scenario("3.16")
def test_an_answer_longer_than_a_pipe_line_reaches_the_worker_as_a_bounded_refusal(
    harness: HostHarness,
):
    harness.add_plugin("big_state_worker", BIG_STATE_WORKER_PLUGIN)
    harness.start_host(
        # Under load, moving 64 MiB through JSON can hold the host's loop past its
        # default lease; this test is about the answer, not the lease.
        PI_WORKFLOWS_HOST_LEASE_MS="300000",
    )
    with HostConnection(harness.home.socket_path) as connection:
        started = connection.request(
            "run.start", start_payload("hello", harness.project, {"pad": "y" * 400_000})
        )
    run_id = started.receipt["runId"]

    def ended() -> dict | None:
        # Moving 64 MiB through JSON keeps the host's loop busy for seconds under load:
        # a status request that finds it busy is asked again.
        client = harness.client()
        try:
            status = client.run_status(run_id)
        except HostUnavailableError:
            return None
        finally:
            client.close()
        return status if status["status"] in TERMINAL_STATUSES else None

    status = wait_until(ended, timeout=120, what="the run to end")
    assert status["status"] == "failed", status
    assert status["error"] == (
        "The host's answer could not be transferred: Protocol message exceeds 64 MiB"
    )
    assert harness.host_process.poll() is None
    assert harness.status()["state"] == "running"


TWO_STEPS = """
from pi_workflows import compute, edge, workflow

WORKFLOW = workflow(
    name="two",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: {"a": 1}),
        "b": compute(lambda ctx: {"sum": ctx.outputs["a"]["a"] + 1}),
    },
    edges=[edge("a", "b")],
)
"""


def test_a_write_sent_again_is_answered_from_its_stored_reply(harness: HostHarness):
    harness.write_workflow("two", TWO_STEPS)
    harness.add_plugin("resending_worker", RESENDING_WORKER_PLUGIN)
    harness.start_host()
    run_id = harness.start_run("two")

    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"sum": 2}
    replies = [json.loads(line) for line in (harness.project / "replies.jsonl").open()]
    # One worker, one message sent twice; a second worker would mean the first one died.
    workers = harness.query(
        "SELECT w.status, w.exit_code, w.signal, b.content FROM run_workers w "
        "LEFT JOIN blobs b ON b.blob_hash = w.diagnostic_hash WHERE w.run_id = ?",
        run_id,
    )
    assert len(replies) == 2 and len(workers) == 1, (workers, replies)
    first, again = replies
    # Applied once: the second copy gets the first one's reply, not a revision conflict.
    assert first["outcome"] == "accepted" and again["outcome"] == "adopted"
    assert (again["revision"], again["result"]) == (first["revision"], first["result"])
    recorded = harness.query(
        "SELECT COUNT(*) FROM worker_messages WHERE message_id = ?", first["messageId"]
    )
    assert recorded == [(1,)]
