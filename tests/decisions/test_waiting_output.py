"""What a person reads at a waiting run: the command that answers it, then where it went.

`run start --wait` and `run status` at a decision or checkpoint print a few lines ending in
the exact command that answers it (the full record stays behind `--json`); once answered,
the parent says `continued as RUN` with the status of the run that carried it on, in
`run status`, `run list` and `run why`.
"""

from __future__ import annotations

import json
import shlex

from tests.host.workflows import CHECKPOINTED

from .conftest import HostHarness, decision_workflow, wait_until

MAX_LINES = 4


def answer_command(output: str) -> list[str]:
    """The `answer:` line's command, as arguments for the CLI."""
    [line] = [line for line in output.splitlines() if line.startswith("answer: pi-workflows ")]
    return shlex.split(line.removeprefix("answer: pi-workflows "))


def test_a_decision_prints_the_command_that_answers_it(harness: HostHarness):
    harness.write_workflow("decide", decision_workflow())
    harness.start_host()

    waited = harness.cli("run", "start", "decide", "--project", str(harness.project), "--wait")

    lines = waited.stdout.splitlines()
    run_id = lines[0].split(":")[0]
    assert len(lines) <= MAX_LINES, waited.stdout
    assert lines[0] == f"{run_id}: waiting for a decision: Ship it?"
    command = answer_command(waited.stdout)
    [decision] = json.loads(harness.cli("decision", "list", "--json").stdout)
    assert command == ["decision", "answer", decision["decisionId"], "CHOICE"]
    status = harness.cli("run", "status", run_id).stdout
    assert answer_command(status) == command
    # The full request record is one flag away.
    record = json.loads(harness.cli("run", "status", run_id, "--json").stdout)
    assert record["finalOutput"]["decisionId"] == decision["decisionId"]

    harness.cli(*command[:-1], "ship")
    child = _continuation(harness, run_id)
    harness.wait_for_run(child)
    assert harness.cli("run", "status", run_id).stdout.startswith(
        f"{run_id}: continued as {child} (completed)"
    )


def test_a_checkpoint_prints_its_answer_command_and_the_parent_its_continuation(
    harness: HostHarness,
):
    harness.write_workflow("checkpointed", CHECKPOINTED)
    harness.start_host()

    waited = harness.cli(
        "run", "start", "checkpointed", "--project", str(harness.project), "--wait"
    )

    lines = waited.stdout.splitlines()
    run_id = lines[0].split(":")[0]
    assert len(lines) <= MAX_LINES and lines[0].endswith("waiting at a checkpoint: Need an answer")
    command = answer_command(waited.stdout)
    assert command == ["checkpoint", "answer", run_id, "--input-json", "JSON"]
    harness.cli(*command[:-1], '{"ok": true}')
    child = _continuation(harness, run_id)
    harness.wait_for_run(child)

    continued = f"continued as {child} (completed)"
    assert harness.cli("run", "status", run_id).stdout.splitlines()[0] == f"{run_id}: {continued}"
    listed = [line.split("  ") for line in harness.cli("run", "list").stdout.splitlines()]
    assert [run_id, "checkpointed", continued] in listed
    assert harness.cli("run", "why", run_id).stdout.splitlines()[0] == (
        f"{run_id}: answered; {continued}"
    )
    status = json.loads(harness.cli("run", "status", run_id, "--json").stdout)
    assert status["status"] == "waiting"  # the record keeps the run's own status
    assert status["continuation"] == {"runId": child, "latestRunId": child, "status": "completed"}


def _continuation(harness: HostHarness, run_id: str) -> str:
    """The run that carries `run_id` on, once its answer started one."""
    client = harness.client()
    try:
        return wait_until(
            lambda: (client.run_status(run_id)["continuation"] or {}).get("runId"),
            what=f"a continuation of {run_id}",
        )
    finally:
        client.close()
