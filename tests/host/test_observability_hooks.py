"""Observability hooks seen by a plugin in a running host: node attempts live, as they
happen, and run transitions with their workflow and time, in the order they happened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import HostHarness, wait_until
from .test_hook_contract import read_jsonl
from .workflows import BLOCKER, CRASHY, STEPS

OBSERVER = """
import json
import os

from pi_workflows.plugin import hookimpl


def _append(entry):
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        handle.write(json.dumps(entry) + "\\n")


def _attempt(hook, attempt):
    _append({
        "hook": hook,
        "run": attempt.run_id,
        "workflow": attempt.workflow_name,
        "node": attempt.node_id,
        "kind": attempt.node_kind,
        "attempt": attempt.attempt_number,
        "attemptId": attempt.attempt_id,
        "startedAt": attempt.started_at,
        "finishedAt": attempt.finished_at,
        "outcome": attempt.outcome,
        "errorClass": attempt.error_class,
        "errorMessage": attempt.error_message,
        "agent": attempt.agent,
    })


@hookimpl
def piw_node_attempt_started(attempt):
    _attempt("started", attempt)


@hookimpl
def piw_node_attempt_finished(attempt):
    _attempt("finished", attempt)


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail, workflow_name, at):
    _append({"hook": "transition", "run": run_id, "old": old_status, "new": new_status,
             "workflow": workflow_name, "at": at})
"""

FAILING = """
from pi_workflows import compute, edge, workflow


def fine(ctx):
    return {"ok": True}


def broken(ctx):
    raise ValueError("the input has no name")


WORKFLOW = workflow(
    name="failing",
    start_at="fine",
    nodes={"fine": compute(fine), "broken": compute(broken)},
    edges=[edge("fine", "broken")],
)
"""


@dataclass
class Observer:
    """What the OBSERVER plugin of a harness's host recorded."""

    path: Path

    def entries(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path)

    def attempts(self, run_id: str) -> list[tuple[str, str]]:
        """(hook, node) of each node-attempt notification of `run_id`, in order."""
        return [
            (e["hook"], e["node"]) for e in self.entries() if e["run"] == run_id and "node" in e
        ]

    def first(self, what: str, **fields: Any) -> dict[str, Any]:
        """The first entry with `fields`, once there is one."""
        return wait_until(
            lambda: next((e for e in self.entries() if fields.items() <= e.items()), None),
            what=what,
        )


@pytest.fixture
def observer(harness: HostHarness) -> Observer:
    """The OBSERVER plugin, in every host the harness starts."""
    path = harness.root / "observed.jsonl"
    harness.add_plugin("observer", OBSERVER)
    harness.env["PIW_TEST_RECORD"] = str(path)
    return Observer(path)


@pytest.mark.hook_effect("piw_node_attempt_started", "piw_node_attempt_finished")
def test_node_attempts_reach_a_plugin_live_in_order_with_times(
    harness: HostHarness, observer: Observer
):
    harness.write_workflow("steps", STEPS)
    harness.start_host()
    run_id = harness.start_run("steps")

    # Node b blocks until released: the plugin has seen a finish while the run runs.
    wait_until(
        lambda: ("started", "b") in observer.attempts(run_id),
        what="the plugin to see node b start",
    )
    assert observer.attempts(run_id) == [
        ("started", "a"),
        ("finished", "a"),
        ("started", "b"),
    ]
    assert harness.client().run_status(run_id)["status"] == "running"

    (harness.project / "release-b").touch()
    harness.wait_for_status(run_id, "completed")

    # The plugin hears of a change after its commit, so after a client may see it.
    def transitions() -> list[dict]:
        return [e for e in observer.entries() if e["hook"] == "transition" and e["run"] == run_id]

    wait_until(
        lambda: (
            ("finished", "c") in observer.attempts(run_id)
            and any(e["new"] == "completed" for e in transitions())
        ),
        what="the plugin to see node c finish and the run complete",
    )
    entries = observer.entries()
    assert observer.attempts(run_id) == [
        (hook, node) for node in "abc" for hook in ("started", "finished")
    ]
    finished = [e for e in entries if e.get("hook") == "finished"]
    for entry in finished:
        assert entry["workflow"] == "steps" and entry["kind"] == "compute"
        assert entry["attempt"] == 1 and entry["outcome"] == "completed"
        assert entry["errorClass"] is None and entry["errorMessage"] is None
        assert 0 < entry["startedAt"] <= entry["finishedAt"]
    started = {e["node"]: e for e in entries if e.get("hook") == "started"}
    assert all(e["finishedAt"] is None and e["outcome"] is None for e in started.values())
    # Each node starts after the one before it finished.
    by_node = {e["node"]: e for e in finished}
    assert by_node["a"]["finishedAt"] <= started["b"]["startedAt"]
    assert by_node["b"]["finishedAt"] <= started["c"]["startedAt"]
    assert {e["attemptId"] for e in finished} == {e["attemptId"] for e in started.values()}

    # The run's transitions: created before claimed, each with its workflow and time.
    changes = transitions()
    assert [(e["old"], e["new"]) for e in changes] == [
        (None, "queued"),
        ("queued", "claimed"),
        ("claimed", "running"),
        ("running", "completed"),
    ]
    assert {e["workflow"] for e in changes} == {"steps"}
    times = [e["at"] for e in changes]
    assert times == sorted(times) and times[0] > 0


def test_a_failing_node_attempt_reports_its_error_class_and_message(
    harness: HostHarness, observer: Observer
):
    harness.write_workflow("failing", FAILING)
    harness.start_host()
    run_id = harness.start_run("failing")
    harness.wait_for_status(run_id, "failed")
    entry = observer.first(
        "the plugin to see the broken node finish", hook="finished", run=run_id, node="broken"
    )
    assert entry["outcome"] == "failed"
    assert entry["errorClass"] == "ValueError"
    assert entry["errorMessage"] == "the input has no name"
    assert entry["workflow"] == "failing"


REPORTING_EXECUTOR = """
from pi_workflows.plugin import hookimpl


class Reporting:
    def run_agent_step(self, request, signal):
        return {
            "output": {"done": True},
            "provider": "local",
            "model": "tiny-1",
            "usage": {"input": 120, "output": 7},
        }


@hookimpl
def piw_register_agent_executors(register):
    register("reporting", Reporting)
"""

AGENT_STEP = """
from pi_workflows import agent, workflow

WORKFLOW = workflow(name="agentic", start_at="work", nodes={"work": agent("Do it.")}, edges=[])
"""


def test_an_agent_attempt_reports_its_executor_model_and_tokens(
    harness: HostHarness, observer: Observer
):
    harness.add_plugin("reporting_executor", REPORTING_EXECUTOR)
    harness.write_workflow("agentic", AGENT_STEP)
    harness.start_host(PI_WORKFLOWS_AGENT_EXECUTOR="reporting")
    run_id = harness.start_run("agentic")  # headless: the step goes to the executor
    harness.wait_for_status(run_id, "completed")
    entry = observer.first("the plugin to see the agent step finish", hook="finished", run=run_id)
    assert entry["kind"] == "agent" and entry["outcome"] == "completed"
    assert entry["agent"] == {
        "executor": "reporting",
        "provider": "local",
        "model": "tiny-1",
        "usage": {"input": 120, "output": 7},
    }
    started = observer.first("the started attempt", hook="started", run=run_id)
    assert started["agent"] is None


def test_cancelling_a_run_finishes_its_running_attempt_as_cancelled(
    harness: HostHarness, observer: Observer
):
    harness.write_workflow("steps", STEPS)
    harness.start_host()
    run_id = harness.start_run("steps")
    wait_until(
        lambda: ("started", "b") in observer.attempts(run_id),
        what="the plugin to see node b start",
    )
    harness.cli("run", "cancel", run_id)
    harness.wait_for_status(run_id, "cancelled")
    # Plugins hear on a thread of their own, after the commit: wait for both notices.
    entries = wait_until(
        lambda: (
            ("finished", "b") in observer.attempts(run_id)
            and any(e.get("new") == "cancelled" for e in observer.entries())
            and observer.entries()
        ),
        what="the plugin to see node b end and the run cancelled",
    )
    assert observer.attempts(run_id) == [
        ("started", "a"),
        ("finished", "a"),
        ("started", "b"),
        ("finished", "b"),
    ]
    ended = next(e for e in entries if e.get("hook") == "finished" and e.get("node") == "b")
    assert ended["outcome"] == "cancelled"
    assert ended["finishedAt"] >= ended["startedAt"]
    transitions = [e["new"] for e in entries if e["hook"] == "transition" and e["run"] == run_id]
    assert transitions[-1] == "cancelled"
    last_attempt = max(i for i, e in enumerate(entries) if e.get("node") == "b")
    cancelled_at = max(i for i, e in enumerate(entries) if e.get("new") == "cancelled")
    assert last_attempt < cancelled_at  # the attempt ends before the run does


# Hangs in a `running` transition while `$PIW_TEST_GATES/hang` exists, until
# `$PIW_TEST_GATES/release` does; records every transition it gets.
HANGING_OBSERVER = """
import json
import os
import time
from pathlib import Path

from pi_workflows.plugin import hookimpl


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail, workflow_name, at):
    with open(os.environ["PIW_TEST_HUNG_RECORD"], "a") as handle:
        handle.write(json.dumps({"run": run_id, "new": new_status}) + "\\n")
    gates = Path(os.environ["PIW_TEST_GATES"])
    if new_status == "running" and (gates / "hang").exists():
        (gates / "hang").unlink()
        (gates / "hanging").touch()
        deadline = time.monotonic() + 120  # a test that fails before releasing it
        while not (gates / "release").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never released the hanging observer")
            time.sleep(0.05)
"""


def test_a_hanging_observer_is_skipped_and_the_host_and_other_observers_go_on(
    harness: HostHarness, observer: Observer
):
    hung_record = harness.root / "hung.jsonl"
    harness.add_plugin("hanging_observer", HANGING_OBSERVER)
    (harness.root / "hang").touch()
    harness.start_host(
        PIW_TEST_GATES=str(harness.root),
        PIW_TEST_HUNG_RECORD=str(hung_record),
        PI_WORKFLOWS_HOOK_TIMEOUT_MS="300",
    )
    try:
        first = harness.start_run("hello")
        wait_until(lambda: (harness.root / "hanging").exists(), what="the observer to hang")
        # The host does not wait for it: runs go on, and so does the other observer.
        later = [harness.start_run("hello") for _ in range(3)]
        for run_id in [first, *later]:
            harness.wait_for_status(run_id, "completed")
        for run_id in later:
            wait_until(
                lambda run_id=run_id: (
                    [e["new"] for e in observer.entries() if e["run"] == run_id and "new" in e]
                    == ["queued", "claimed", "running", "completed"]
                ),
                what=f"the other observer to see run {run_id} in order",
            )

        def hung_lines() -> list[str]:
            return [
                line
                for line in harness.host_log().splitlines()
                if "did not return from hook piw_run_transition" in line
            ]

        # Said once its 300 ms are up, whether or not another notification comes.
        wait_until(hung_lines, what="the host to say the observer hangs")
        [line] = hung_lines()
        assert "'hanging_observer'" in line and "300 ms" in line
        assert not any(run_id in line for run_id in [first, *later])  # no run data
        # Skipped, not queued: it missed what came while it hung.
        assert {e["run"] for e in read_jsonl(hung_record)} == {first}
    finally:
        (harness.root / "release").touch()

    wait_until(
        lambda: "returned from hook piw_run_transition" in harness.host_log(),
        what="the host to see the hung call return",
    )
    again = harness.start_run("hello")
    harness.wait_for_status(again, "completed")
    wait_until(
        lambda: (
            [e["new"] for e in read_jsonl(hung_record) if e["run"] == again]
            == ["queued", "claimed", "running", "completed"]
        ),
        what="the released observer to get notifications again",
    )


# After its call for a run's `running`, the plugin holds its delivery thread at the top of
# the loop, on its way back to wait for the next notification (no lock held, the call's end
# told), as if the OS ran other threads there: it polls until the line's hook-deadline watch
# is queued on its condition, so the watch waits first, whether the two share a condition or
# not. It records when the watch waits and when the delivery thread waits again.
SLOW_TO_COME_BACK = """
import json
import os
import sys
import threading

from pi_workflows.plugin import hookimpl
from pi_workflows.testing.polling import wait_until


def _append(entry):
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        handle.write(json.dumps(entry) + "\\n")


def _watch_waits(line):
    # The line's hook-deadline watch is in Condition.wait with its waiter lock queued on
    # the condition (the one the delivery thread waits on too, or its own).
    name = "pi-workflows-watch-" + line.plugin
    watch = next(thread for thread in threading.enumerate() if thread.name == name)
    frame = sys._current_frames().get(watch.ident)
    if frame is None or frame.f_code is not threading.Condition.wait.__code__:
        return False
    waiter = frame.f_locals.get("waiter")
    return waiter is not None and waiter in frame.f_locals["self"]._waiters


def _held_at_the_top(line, call_line):
    # Back at the top of its loop (a line above the call it came back from), the delivery
    # thread holds no lock and has told the watch the call ended: it goes on only once
    # the watch waits, so the watch waits first.
    def pause(frame, event, arg):
        if event != "line" or frame.f_lineno >= call_line:
            return pause
        frame.f_trace = None
        try:
            wait_until(lambda: _watch_waits(line), timeout=10.0, what="the watch to wait")
        except AssertionError:
            _append({"watch": "did not wait"})
        else:
            _append({"watch": "waits"})
        return None

    return pause


def _until_it_waits(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "wait":
        frame.f_back.f_trace = None
        sys.settrace(None)
        _append({"delivery": "waits"})


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail, workflow_name, at):
    _append({"run": run_id, "new": new_status})
    if new_status == "running":
        caller = sys._getframe(1)  # the delivery thread's loop, calling this
        caller.f_trace = _held_at_the_top(caller.f_locals["self"], caller.f_lineno)
        caller.f_trace_lines = True
        sys.settrace(_until_it_waits)
"""


def test_a_run_end_reaches_a_plugin_whose_delivery_thread_was_slow_to_come_back(
    harness: HostHarness,
):
    record = harness.root / "transitions.jsonl"
    harness.add_plugin("slow_to_come_back", SLOW_TO_COME_BACK)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PIW_TEST_RECORD=str(record))
    run_id = harness.start_run("blocker")
    wait_until(
        lambda: {"delivery": "waits"} in read_jsonl(record),
        what="the delivery thread to wait again after the run's running",
    )
    # The watch queued itself on its condition before the delivery thread did.
    assert [e for e in read_jsonl(record) if "run" not in e] == [
        {"watch": "waits"},
        {"delivery": "waits"},
    ]

    # The run's end is the only notification that comes: nothing else wakes the line.
    (harness.project / "release").touch()
    harness.wait_for_status(run_id, "completed")
    wait_until(
        lambda: {"run": run_id, "new": "completed"} in read_jsonl(record),
        what="the plugin to hear the run end",
    )
    statuses = [e["new"] for e in read_jsonl(record) if e.get("run") == run_id]
    assert statuses == ["queued", "claimed", "running", "completed"]


WORKER_EXITS = """
import json
import os

from pi_workflows.plugin import hookimpl


@hookimpl
def piw_worker_exited(run_id, outcome, exit_code, signal, at):
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        entry = {"run": run_id, "outcome": outcome, "exitCode": exit_code, "signal": signal}
        handle.write(json.dumps({**entry, "at": at}) + "\\n")
"""


@pytest.mark.hook_effect("piw_worker_exited")
def test_a_plugin_hears_each_worker_exit_a_crash_and_a_clean_one(harness: HostHarness):
    record = harness.root / "exits.jsonl"
    harness.add_plugin("worker_exits", WORKER_EXITS)
    harness.write_workflow("crashy", CRASHY)
    (harness.project / "crash-on-load").touch()
    harness.start_host(PIW_TEST_RECORD=str(record))
    run_id = harness.start_run("crashy")
    crash = wait_until(
        lambda: next((e for e in read_jsonl(record) if e["run"] == run_id), None),
        what="the plugin to hear the killed worker",
    )
    assert (crash["outcome"], crash["exitCode"], crash["signal"]) == ("crashed", None, 9)
    assert "Traceback" not in harness.host_log()  # a death the host expects, not its error
    assert crash["at"] > 0

    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workerNoProgress",
        what="the no-progress park",
    )
    (harness.project / "crash-on-load").unlink()
    harness.cli("run", "resume", run_id)
    harness.wait_for_status(run_id, "completed")
    exits = wait_until(
        lambda: len(e := [x for x in read_jsonl(record) if x["run"] == run_id]) == 2 and e,
        what="the plugin to hear the second worker end",
    )
    assert [(e["outcome"], e["exitCode"], e["signal"]) for e in exits] == [
        ("crashed", None, 9),
        ("exited", 0, None),
    ]
    assert exits[0]["at"] <= exits[1]["at"]
