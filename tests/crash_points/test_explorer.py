"""The crash-point explorer finds what it promises to find: the worked example of the test
kit's docs passes, and the same workflow with an effect that is not idempotent fails at the
boundary where it runs twice."""

from __future__ import annotations

from collections import Counter

import pytest

from pi_workflows.testing import WorkflowHost
from pi_workflows.testing.crash_points import CrashCase, CrashPoints

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
