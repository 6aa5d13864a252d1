"""The crash-point explorer finds what it promises to find: the worked example of the test
kit's docs passes, and the same workflow with an effect that is not idempotent fails at the
boundary where it runs twice."""

from __future__ import annotations

from collections import Counter

import pytest

from pi_workflows.testing import WorkflowHost
from pi_workflows.testing.crash_points import CrashCase, CrashPoints
from tests.host.workflows import relayed_worker_plugin

MARK = """
from pi_workflows import compute, edge, idempotent_effect, shell, workflow

WORKFLOW = workflow(name="mark", start_at="write", edges=[edge("write", "done")], nodes={
    "write": shell(lambda ctx: {"command": "sh", "args": ["-c", 'echo marked REDIRECT "$0"',
                                                          ctx.input["log"]]},
                   effect=idempotent_effect("mark")),
    "done": compute(lambda ctx: {"ok": True}),
})
"""


def mark_case(redirect: str) -> CrashCase:
    def effects(host: WorkflowHost) -> Counter[str]:
        log = host.root / "log"
        return Counter(log.read_text().split()) if log.exists() else Counter()

    return CrashCase(
        "mark",
        prepare=lambda host: host.write_workflow("mark", MARK.replace("REDIRECT", redirect)),
        input_for=lambda host: {"log": str(host.root / "log")},
        effects=effects,
    )


@pytest.mark.integration
def test_the_docs_example_survives_a_worker_kill_at_each_kind_of_boundary(
    crash_points: CrashPoints,
):
    report = crash_points.explore(mark_case(">"), targets=("worker",))

    assert report.kills >= 2 and not report.failures, report.summary()


@pytest.mark.integration
def test_an_effect_that_is_not_idempotent_is_caught_at_its_boundary(crash_points: CrashPoints):
    report = crash_points.explore(
        mark_case(">>"),
        targets=("host",),
        where=lambda boundary: "effect.settled" in boundary.events.values(),
    )

    # The shell ran; the host died before its result was durable; the next host ran the
    # "idempotent" effect again. Killed after that commit, nothing runs twice.
    assert [(trial.when, trial.target) for trial in report.failures] == [("before", "host")]
    assert "effects applied {'marked': 2}, not {'marked': 1}" in report.failures[0].failures
    assert "host killed before boundary #" in report.summary()
    assert "(effect.settled): effects applied" in report.summary()


@pytest.mark.integration
def test_a_run_that_never_settles_fails_with_the_hosts_last_log_lines(crash_points: CrashPoints):
    # Nobody answers the decision: the run waits until the case's time runs out.
    stranded = CrashCase("human-decision", timeout=3.0)

    with pytest.raises(AssertionError) as failure:
        crash_points.explore(stranded, targets=("worker",))

    message = str(failure.value)
    assert "runs not settled after 3 s:" in message and " waiting" in message
    log = message.split("the host's log, last 40 lines:\n", 1)[1]
    assert "ready at epoch" in log and log.count("\n") < 40


# The built-in worker behind a relay that holds its first write until the host's poll has
# committed worker.ready's bookkeeping (`run.queue_running`, the queue row `running`) on
# its own: a durable boundary with a live worker that has made no progress yet. Under
# load that boundary happens by itself. In a trial that kills at that boundary it holds
# the write until it is killed: the kill point kills "after" only once it has synced its
# record of the kill, and a write let through meanwhile reached the host as progress.
SLOW_FIRST_WRITE = relayed_worker_plugin(
    r"""
import sqlite3
import time

READS = {"worker.ready", "worker.exiting", "store.readRunState"}
LAUNCH = json.loads(os.environ["PI_WORKFLOWS_WORKER_LAUNCH"])
held = []


def queue_running():
    uri = f"file:{LAUNCH['home']}/state.sqlite?mode=ro"
    with sqlite3.connect(uri, uri=True) as db:
        row = db.execute(
            "SELECT status FROM run_queue WHERE run_id = ?", (LAUNCH["runId"],)
        ).fetchone()
    return row == ("running",)


# Whether the explorer's kill point is armed and has not fired at another worker.
def kill_coming():
    spec = os.environ.get("PI_WORKFLOWS_TEST_KILL_POINT")
    if not spec or json.loads(open(spec).read())["mode"] != "kill":
        return False
    try:
        fired = json.loads(open(spec + ".fired").read())
    except FileNotFoundError:
        return True
    except ValueError:  # being written: the kill is under way
        return True
    return os.getpid() in fired["pids"]


def from_host(frame):
    return True


def from_worker(message):
    if not held and message["operation"] not in READS:
        held.append(message["messageId"])
        deadline = time.monotonic() + 30
        while not queue_running() and time.monotonic() < deadline:
            time.sleep(0.02)
        while kill_coming() and time.monotonic() < deadline:
            time.sleep(0.02)
    return 1
"""
)


@pytest.mark.integration
def test_a_worker_killed_before_its_first_progress_is_resumed_once_as_an_operator_would(
    crash_points: CrashPoints,
):
    case = mark_case(">")
    prepare = case.prepare
    assert prepare is not None

    def slow_first_write(host: WorkflowHost) -> None:
        prepare(host)
        host.add_plugin("slow_first_write", SLOW_FIRST_WRITE)

    case.prepare = slow_first_write
    case.host_env = {"PI_WORKFLOWS_POLL_S": "0.1"}
    report = crash_points.explore(
        case,
        targets=("worker",),
        where=lambda boundary: boundary.kind == {"run.queue_running"},
    )

    # SPEC §7.4: a worker that dies before any progress parks its run (workerNoProgress)
    # until `run resume`; once resumed it completes, its effect applied once.
    assert [(trial.when, bool(trial.killed)) for trial in report.trials] == [
        ("before", True),
        ("after", True),
    ], report.summary()
    assert all(len(trial.resumed) == 1 for trial in report.trials), report.summary()
    assert not report.failures, report.summary()
