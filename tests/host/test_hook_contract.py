"""The hook contract of SPEC §3, kept by a running host (each plugin changes what it does).

Every test loads a plugin module (`harness.add_plugin`: named in `PI_WORKFLOWS_PLUGINS`)
in a real `pi-workflows host run` and the CLI, then watches the host's behaviour: which
runs it claims, what it logs, what its database looks like, what it tells the plugin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.client.start_request import start_payload

from .conftest import HostHarness, wait_until
from .workflows import BLOCKER, CHECKPOINTED, HOLD_CLAIMS_PLUGIN, STEPS


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


RECORDER = """
import json
import os

from pi_workflows import hookimpl


def _append(entry):
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        handle.write(json.dumps(entry) + "\\n")


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail):
    _append({"hook": "transition", "run": run_id, "old": old_status, "new": new_status,
             "detail": detail})


@hookimpl
def piw_run_claimed(run, claim):
    _append({"hook": "claimed", "run": run.run_id, "generation": claim.generation})
"""


# --- claiming ------------------------------------------------------------------------------


VETO = """
from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    return not (isinstance(run.input, dict) and run.input.get("veto"))
"""


@pytest.mark.hook_effect("piw_may_claim")
def test_a_vetoed_run_is_skipped_and_the_runs_behind_it_are_claimed(harness: HostHarness):
    harness.add_plugin("veto", VETO)
    harness.start_host()
    vetoed = harness.start_run("hello", {"veto": True})
    behind = harness.start_run("hello", {"name": "Bea"})
    status = harness.wait_for_status(behind, "completed", timeout=20)
    assert status["finalOutput"] == {"greeting": "Hello, Bea!"}
    assert harness.client().run_status(vetoed)["status"] == "queued"


WINDOW_SPY = """
import json
import os

from pi_workflows import hookimpl


@hookimpl
def piw_select_run_to_claim(candidates, host):
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        handle.write(json.dumps([run.run_id for run in candidates]) + "\\n")
    return None
"""


def _queue_behind_a_blocker(
    harness: HostHarness, older: int, **env: str
) -> tuple[str, list[str], str]:
    """A one-worker host busy with a blocker run, `older` hello runs queued behind it, then
    one of priority 5: (blocker, older, urgent). Touch `release` to let the blocker end."""
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1", **env)
    blocker = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    client = harness.client()
    payload = start_payload("hello", harness.project)
    older_ids = [client.start_run(payload)["runId"] for _ in range(older)]
    urgent = client.start_run({**payload, "priority": 5})["runId"]
    return blocker, older_ids, urgent


@pytest.mark.hook_effect("piw_select_run_to_claim")
def test_priority_wins_over_age_whatever_the_candidate_window(harness: HostHarness):
    record = harness.root / "candidates.jsonl"
    harness.add_plugin("window_spy", WINDOW_SPY)
    blocker, older, urgent = _queue_behind_a_blocker(harness, 70, PIW_TEST_RECORD=str(record))
    client = harness.client()
    assert client.run_status(urgent)["priority"] == 5
    assert client.run_status(older[0])["priority"] == 0
    record.write_text("")  # only the passes after the release matter
    (harness.project / "release").touch()
    harness.wait_for_status(blocker, "completed")
    harness.wait_for_status(urgent, "completed")
    first_pass = read_jsonl(record)[0]
    assert len(first_pass) == 64  # the documented default window
    assert first_pass[0] == urgent  # ordered by priority before age
    started = dict(
        harness.query("SELECT run_id, started_at FROM run_queue WHERE started_at IS NOT NULL")
    )
    assert all(started[urgent] < started[run_id] for run_id in older if run_id in started)


def test_without_a_selection_plugin_priority_then_age_decide_the_claims(harness: HostHarness):
    """Alone, the built-in selection is not asked: the host takes the first run in claim
    order, which must still be the one the built-in would pick."""
    blocker, older, urgent = _queue_behind_a_blocker(harness, 3)
    (harness.project / "release").touch()
    for run_id in [blocker, *older, urgent]:
        harness.wait_for_status(run_id, "completed")
    rows = harness.query("SELECT run_id, started_at, available_at FROM run_queue")
    started = {run_id: at for run_id, at, _ in rows}
    available = {run_id: at for run_id, _, at in rows}
    first, *then = sorted([*older, urgent], key=started.__getitem__)
    assert first == urgent
    # Then by age, to the millisecond: runs queued within one are equally old.
    assert [available[run_id] for run_id in then] == sorted(available[r] for r in older)


def test_the_candidate_window_follows_the_environment(harness: HostHarness):
    record = harness.root / "candidates.jsonl"
    harness.add_plugin("window_spy", WINDOW_SPY)
    blocker, _, _ = _queue_behind_a_blocker(
        harness, 4, PI_WORKFLOWS_CLAIM_WINDOW="3", PIW_TEST_RECORD=str(record)
    )
    record.write_text("")
    (harness.project / "release").touch()
    harness.wait_for_status(blocker, "completed")
    wait_until(lambda: read_jsonl(record), what="a claim pass after the release")
    assert len(read_jsonl(record)[0]) == 3


BY_NAME_DESCENDING = """
from pi_workflows import hookimpl


@hookimpl
def piw_select_run_to_claim(candidates, host):
    named = [run for run in candidates if isinstance(run.input, dict) and "name" in run.input]
    return max(named, key=lambda run: run.input["name"], default=None)
"""


def test_a_selection_plugin_reads_every_candidates_input(harness: HostHarness):
    """Candidates reach the hook with their JSON still encoded; reading `input` decodes it."""
    harness.add_plugin("by_name_descending", BY_NAME_DESCENDING)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    blocker = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    names = ["Ann", "Cy", "Bo"]
    run_ids = {name: harness.start_run("hello", {"name": name}) for name in names}
    (harness.project / "release").touch()
    harness.wait_for_status(blocker, "completed")
    for run_id in run_ids.values():
        harness.wait_for_status(run_id, "completed")
    started = dict(harness.query("SELECT run_id, started_at FROM run_queue"))
    claimed_order = sorted(names, key=lambda name: started[run_ids[name]])
    assert claimed_order == ["Cy", "Bo", "Ann"]


TRANSITION_ORDER = """
import json
import os

from pi_workflows import hookimpl


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail, workflow_name, at):
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        handle.write(json.dumps({"run": run_id, "new": new_status, "at": at}) + "\\n")
"""


def test_the_commit_that_frees_a_worker_slot_claims_the_run_waiting_for_it(
    harness: HostHarness,
):
    record = harness.root / "transitions.jsonl"
    harness.add_plugin("transition_order", TRANSITION_ORDER)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1", PIW_TEST_RECORD=str(record))
    blocker = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    waiting = harness.start_run("hello", {"name": "next"})
    assert harness.client().run_status(waiting)["queueStatus"] == "queued"

    (harness.project / "release").touch()
    harness.wait_for_status(blocker, "completed")
    harness.wait_for_status(waiting, "completed")

    # The blocker's last write released its claim and, in the same commit, claimed the
    # waiting run: no commit of its own, no wait for the blocker's worker to exit. One
    # commit's changes are announced together (same time), the run that goes on before
    # the run that ended; a claim committed after the end would come after it.
    def changes() -> list[tuple[str, str]]:
        return [(entry["run"], entry["new"]) for entry in read_jsonl(record)]

    wait_until(lambda: (waiting, "completed") in changes(), what="the waiting run's end")
    entries, order = read_jsonl(record), changes()
    claimed, ended = order.index((waiting, "claimed")), order.index((blocker, "completed"))
    assert claimed < ended
    assert entries[claimed]["at"] == entries[ended]["at"]


def test_run_start_priority_is_saved_and_shown(harness: HostHarness):
    harness.start_host()
    status = json.loads(
        harness.cli("run", "start", "hello", "--priority", "7", "--wait", "--json").stdout
    )
    assert status["priority"] == 7
    listed = json.loads(harness.cli("run", "list", "--json").stdout)
    assert listed[0]["priority"] == 7
    refused = harness.cli("run", "start", "hello", "--priority", "soon", check=False)
    assert refused.returncode == 2 and "--priority" in refused.stderr


# --- registration hooks -----------------------------------------------------------------


BROKEN_REGISTRIES = """
from pi_workflows import hookimpl


@hookimpl
def piw_register_workflows(register):
    raise RuntimeError("no workflows today")


@hookimpl
def piw_register_decision_channels(register):
    raise RuntimeError("no channels today")


@hookimpl
def piw_workflow_dirs(project):
    raise RuntimeError("no directories today")
"""

EXTRA_WORKFLOWS = """
from pi_workflows import compute, hookimpl, workflow

GREET = workflow(
    name="greet",
    start_at="say",
    nodes={"say": compute(lambda ctx: {"said": "hi"})},
    edges=[],
)


@hookimpl
def piw_register_workflows(register):
    register("greet", GREET, revision="1")
"""


@pytest.mark.hook_effect("piw_register_workflows", "piw_workflow_dirs")
def test_one_raising_registration_plugin_hides_nothing_else(harness: HostHarness):
    harness.add_plugin("broken_registries", BROKEN_REGISTRIES)
    harness.add_plugin("extra_workflows", EXTRA_WORKFLOWS)
    harness.start_host()  # the raising channel registration does not stop the host
    hello = harness.cli("run", "start", "hello", "--wait", "--no-autostart")
    assert "Hello, world!" in hello.stdout
    greet = harness.cli("run", "start", "greet", "--wait", "--json", "--no-autostart")
    run = json.loads(greet.stdout)
    assert run["finalOutput"] == {"said": "hi"}
    ((source,),) = harness.query("SELECT workflow_source FROM runs WHERE run_id = ?", run["runId"])
    assert json.loads(source)["kind"] == "plugin"  # a third party's workflow, not "builtin"
    assert json.loads(source)["plugin"] == "extra_workflows"
    listed = harness.cli("workflows").stdout
    assert "broken_registries" in listed and "no workflows today" in listed
    wait_until(
        lambda: (
            "broken_registries" in harness.host_log()
            and "piw_register_decision_channels" in harness.host_log()
        ),
        what="the host to name the plugin whose channel registration failed",
    )


# --- storage -------------------------------------------------------------------------------


PLAIN_SQLITE = """
import json
import os
from pathlib import Path

import peewee

from pi_workflows import hookimpl

DATABASE = None


@hookimpl
def piw_open_database(url, home):
    global DATABASE
    DATABASE = peewee.SqliteDatabase(str(Path(home) / "plugin-state.sqlite"))
    return DATABASE


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail):
    names = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
    pragmas = {name: DATABASE.execute_sql(f"PRAGMA {name}").fetchone()[0] for name in names}
    # Whole or not at all: the test reads it while this may run again.
    record = Path(os.environ["PIW_TEST_RECORD"])
    record.with_suffix(".part").write_text(json.dumps(pragmas))
    os.replace(record.with_suffix(".part"), record)
"""


@pytest.mark.hook_effect("piw_open_database")
def test_the_core_applies_sqlite_pragmas_to_a_plugin_database(harness: HostHarness):
    record = harness.root / "pragmas.json"
    harness.add_plugin("plain_sqlite", PLAIN_SQLITE)
    harness.start_host(PIW_TEST_RECORD=str(record))
    harness.cli("run", "start", "hello", "--wait", "--no-autostart")
    assert (harness.home.root / "plugin-state.sqlite").exists()
    wait_until(record.exists, what="the plugin to read the pragmas in the host")
    assert json.loads(record.read_text()) == {
        "journal_mode": "wal",
        "synchronous": 2,  # FULL
        "foreign_keys": 1,
        "busy_timeout": 5000,
    }


# --- required hooks --------------------------------------------------------------------------


def test_without_a_claim_selector_the_host_says_which_plugin_is_missing(harness: HostHarness):
    harness.env["PI_WORKFLOWS_DISABLE_PLUGINS"] = "pi_workflows.builtin.claiming"
    harness.start_host()
    run_id = harness.start_run("hello")
    wait_until(
        lambda: (
            "piw_select_run_to_claim" in harness.host_log()
            and "pi_workflows.builtin.claiming" in harness.host_log()
        ),
        what="the host to name the unanswered hook and the disabled plugin",
    )
    assert harness.client().run_status(run_id)["status"] == "queued"


def test_without_a_launcher_the_run_says_which_plugin_is_missing(harness: HostHarness):
    harness.env["PI_WORKFLOWS_DISABLE_PLUGINS"] = "pi_workflows.builtin.launch"
    harness.start_host()
    run_id = harness.start_run("hello")
    status = wait_until(
        lambda: (s := harness.client().run_status(run_id))["statusDetail"] and s,
        what="the run to explain why it could not launch",
    )
    assert "piw_worker_process" in status["statusDetail"]
    assert "pi_workflows.builtin.launch" in status["statusDetail"]
    assert "AttributeError" not in harness.host_log()


# --- events ------------------------------------------------------------------------------


def transitions(record: Path, run_id: str) -> list[tuple[str | None, str]]:
    return [
        (entry["old"], entry["new"])
        for entry in read_jsonl(record)
        if entry["hook"] == "transition" and entry["run"] == run_id
    ]


@pytest.mark.hook_effect("piw_run_transition")
def test_every_status_change_of_a_run_is_announced_with_its_detail(harness: HostHarness):
    record = harness.root / "events.jsonl"
    harness.add_plugin("recorder", RECORDER)
    harness.start_host(PIW_TEST_RECORD=str(record))
    run_id = json.loads(harness.cli("run", "start", "hello", "--wait", "--json").stdout)["runId"]
    expected = [(None, "queued"), ("queued", "claimed"), ("claimed", "running")]
    expected.append(("running", "completed"))
    wait_until(lambda: transitions(record, run_id) == expected, what=f"transitions {expected}")
    details = [e["detail"] for e in read_jsonl(record) if e["hook"] == "transition"]
    assert all(isinstance(detail, str) and detail for detail in details)

    harness.write_workflow("checkpointed", CHECKPOINTED)
    waiting = harness.start_run("checkpointed")
    wait_until(
        lambda: transitions(record, waiting)[-1:] == [("running", "waiting")],
        what="the checkpoint to park the run as waiting",
    )
    # Every hook these runs reached (claim, launch, run command, the notifications, the
    # terminal message's) was called as its contract says: none inside a transaction.
    assert "pi-workflows bug" not in harness.host_log()


@pytest.mark.hook_effect("piw_run_claimed")
def test_pause_resume_and_resume_claims_are_announced(harness: HostHarness):
    record = harness.root / "events.jsonl"
    harness.add_plugin("recorder", RECORDER)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PIW_TEST_RECORD=str(record))
    run_id = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    harness.cli("run", "pause", run_id)
    wait_until(
        lambda: transitions(record, run_id)[-1:] == [("running", "paused")],
        what="the pause to be announced",
    )
    harness.cli("run", "resume", run_id)

    def resumed_and_claimed() -> bool:
        # Claimed at once, or (a resume while the paused worker still stops) queued as
        # parked first and claimed once that worker has exited.
        after = [new for old, new in transitions(record, run_id)[4:]]
        return after[:1] == ["claimed"] or after[:2] == ["parked", "claimed"]

    wait_until(resumed_and_claimed, what="the resume to be announced")
    wait_until(
        lambda: len([e for e in read_jsonl(record) if e["hook"] == "claimed"]) == 2,
        what="piw_run_claimed for the resume claim",
    )
    claims = [e for e in read_jsonl(record) if e["hook"] == "claimed" and e["run"] == run_id]
    assert claims[1]["generation"] > claims[0]["generation"]
    (harness.project / "release").touch()
    harness.wait_for_status(run_id, "completed")
    wait_until(
        lambda: transitions(record, run_id)[-1:] == [("running", "completed")],
        what="the completion to be announced",
    )


# --- launch and agents -----------------------------------------------------------------------


RUN_COMMAND = """
from pi_workflows import hookimpl
from pi_workflows.plugin import WorkerRunCommand


@hookimpl
def piw_worker_run_command(record, resume_interaction_attempt_id):
    if record.workflow_name == "hello" and not record.is_initialized:
        return WorkerRunCommand("start", input={"name": "a plugin"})
    return None
"""


@pytest.mark.hook_effect("piw_worker_run_command")
def test_a_run_command_plugin_decides_what_the_worker_does(harness: HostHarness):
    harness.add_plugin("run_command", RUN_COMMAND)
    harness.start_host()
    result = harness.cli("run", "start", "hello", "--input-json", '{"name": "Ada"}', "--wait")
    assert "Hello, a plugin!" in result.stdout


def _headless_echo(harness: HostHarness, executor: str) -> dict[str, Any]:
    """Run the built-in `echo` workflow headless on `executor`; its completed status."""
    harness.start_host(PI_WORKFLOWS_AGENT_EXECUTOR=executor)
    status = json.loads(
        harness.cli("run", "start", "echo", "--headless", "--wait", "--json").stdout
    )
    assert status["status"] == "completed", status
    return status


CONSTANT_EXECUTOR = """
from pi_workflows import hookimpl


class Constant:
    def run_agent_step(self, request, signal):
        return {"output": {"reply": "constant: " + request["contract"]["nodeId"]}}


@hookimpl
def piw_register_agent_executors(register):
    register("constant", Constant)
"""


@pytest.mark.hook_effect("piw_register_agent_executors")
def test_an_executor_plugin_answers_headless_agent_steps(harness: HostHarness):
    harness.add_plugin("constant_executor", CONSTANT_EXECUTOR)
    status = _headless_echo(harness, executor="constant")
    assert status["finalOutput"] == {"reply": "constant: reply"}


PROMPT_ECHO = """
from pi_workflows import hookimpl


class PromptEcho:
    def run_agent_step(self, request, signal):
        return {"output": {"reply": request["prompt"]}}


@hookimpl
def piw_register_agent_executors(register):
    register("prompt-echo", PromptEcho)


@hookimpl
def piw_step_prompt(contract, authored):
    return f"{authored}\\n\\nANSWER IN HAIKU then submit step {contract['nodeId']} "\\
        f"(attempt {contract['attemptId']}) of {contract['workflowName']}."
"""


@pytest.mark.hook_effect("piw_step_prompt")
def test_a_step_prompt_plugin_writes_what_the_agent_is_told(harness: HostHarness):
    harness.add_plugin("prompt_echo", PROMPT_ECHO)
    status = _headless_echo(harness, executor="prompt-echo")

    prompt = status["finalOutput"]["reply"]
    assert "ANSWER IN HAIKU then submit step reply (attempt " in prompt
    assert prompt.endswith(" of echo.")
    assert "Workflow step contract" not in prompt  # the built-in block was replaced


@pytest.mark.integration
def test_one_claim_pass_fills_every_free_worker_slot(harness: HostHarness):
    """The pass a host runs as it starts (outside any transaction) claims as many queued
    runs as it has free slots, not half of them."""
    runs = 4
    harness.write_workflow("steps", STEPS)
    harness.add_plugin("hold_claims", HOLD_CLAIMS_PLUGIN)
    (harness.project / "hold-claims").touch()
    harness.start_host()
    run_ids = harness.start_runs("steps", runs)
    harness.stop()
    (harness.project / "hold-claims").unlink()

    # No poll pass for a minute: only the start-up pass can claim them.
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS=str(runs), PI_WORKFLOWS_POLL_S="60")
    trace = harness.project / "trace"
    wait_until(
        lambda: trace.exists() and trace.read_text().split().count("b") == runs,
        timeout=20,
        what="every queued run to reach its second node",
    )
    (harness.project / "release-b").touch()
    for run_id in run_ids:
        assert harness.wait_for_run(run_id)["status"] == "completed"
