"""Headless agent steps on the real `pi`: a host, its worker, pi, the bridge, a scripted model."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess

import pytest

from tests.host.test_observability_hooks import Observer, observer  # noqa: F401  (fixture)
from tests.pi.conftest import PiHost
from tests.pi.model_server import Hold, HttpError, MalformedStream, Text, ToolCall, ToolCalls
from tests.pi.offline_pi import PiHome, bundled_node
from tests.pi.step_replies import submit, workflow_call
from tests.polling import process_gone, wait_until

COUNTED = """
from pi_workflows import agent, workflow


def check(output, ctx):
    if not isinstance(output, dict) or not isinstance(output.get("count"), int):
        raise ValueError("count must be an integer, not " + repr(output.get("count")))
    return output


WORKFLOW = workflow(
    name="counted",
    start_at="count",
    nodes={"count": agent("Count the files.", expected_output='{"count": <int>}', validate=check)},
    edges=[],
)
"""

# Pi's own retries would take 14 s (2 + 4 + 8 s); the provider SDK's two quick ones ~1.5 s.
FAIL_FAST_SECONDS = 6

SLOW_STEP = """
from pi_workflows import agent, workflow

WORKFLOW = workflow(
    name="slow-step",
    start_at="think",
    nodes={"think": agent("Think hard.", timeout_ms=TIMEOUT_MS)},
    edges=[],
)
"""


# An agent step after a compute step that waits for a file the test creates.
AGENT_AFTER_WORK = """
import pathlib
import time

from pi_workflows import agent, compute, edge, workflow


def work(ctx):
    deadline = time.monotonic() + 60
    while not pathlib.Path("go").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("go never appeared")
        time.sleep(0.05)
    return {"worked": True}


WORKFLOW = workflow(
    name="agent-after-work",
    start_at="work",
    nodes={"work": compute(work), "reply": agent("Say hello.")},
    edges=[edge("work", "reply")],
)
"""


def _finished(pi_host, run_id, timeout=60):
    return pi_host.harness.wait_for_status(
        run_id, "completed", "failed", "timed_out", "cancelled", timeout=timeout
    )


def _pi_processes_running(pi_host):
    return wait_until(pi_host.pi_home.processes, timeout=60, what="pi to be running")


def _tool_command_running(pi_host, name):
    """pi's processes once one of them is the command `name` a tool call started."""

    def found():
        processes = pi_host.pi_home.processes()
        return any(p.name() == name for p in processes) and processes

    return wait_until(found, timeout=60, what=f"pi to run {name!r} for a tool call")


def test_echo_runs_headless_on_pi_and_completes_with_the_submitted_output(pi_host, model_server):
    model_server.script(submit({"reply": "hello from pi"}))
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"reply": "hello from pi"}
    (request,) = model_server.requests
    assert "Task: Say hello" in request.last_user_text()
    tool = request.tool("workflow")
    assert tool["parameters"]["properties"]["action"]["enum"] == ["update", "submit"]
    assert tool["parameters"]["additionalProperties"] is False


def test_a_pi_step_reports_its_provider_model_and_tokens_to_the_node_attempt_hooks(
    observer: Observer,  # noqa: F811  (its plugin is in the host pi_host starts)
    pi_host,
    model_server,
):
    # Two model requests, each reporting 10 prompt and 5 completion tokens: a rejected
    # submit, then an accepted one. The step's usage is their sum.
    model_server.script(submit({"count": "three"}), submit({"count": 3}))
    pi_host.harness.write_workflow("counted", COUNTED)
    run_id = pi_host.start_headless("counted")
    assert _finished(pi_host, run_id)["status"] == "completed"
    entry = observer.first("the plugin to see the agent step finish", hook="finished", run=run_id)
    provider, model = pi_host.pi_home.model.split("/", 1)
    agent = entry["agent"]
    assert (agent["executor"], agent["provider"], agent["model"]) == ("pi", provider, model)
    assert agent["usage"]["input"] + agent["usage"].get("cacheRead", 0) == 20, agent
    assert (agent["usage"]["output"], agent["usage"]["totalTokens"]) == (10, 30), agent


def test_pi_runs_on_its_own_node_with_a_private_compile_cache_its_tools_do_not_see(
    pi_host, model_server
):
    node = bundled_node()
    seen = pi_host.harness.project / "seen-by-the-agent.txt"
    model_server.script(
        ToolCalls(ToolCall("bash", {"command": f"env > {seen}; node --version >> {seen}"})),
        submit({"reply": "done"}),
    )
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    assert _finished(pi_host, run_id)["status"] == "completed"
    # The caches are the bundled Node's (Node names its folder by version), and private.
    cache = pi_host.pi_home.root / ".cache" / "pi-workflows" / "node-compile-cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    version = subprocess.run([str(node), "--version"], capture_output=True, text=True).stdout
    (compiled,) = [path for path in cache.iterdir() if path.is_dir()]
    assert compiled.name.startswith(version.strip() + "-")
    assert any(compiled.iterdir()), "pi's modules were not compiled into the cache"
    (resolutions,) = cache.glob(f"resolutions-{version.strip()}-*.json")
    assert stat.S_IMODE(resolutions.stat().st_mode) == 0o600
    # The agent's commands see nothing of the launcher, and `node` is the system's.
    *environment, node_version = seen.read_text().splitlines()
    ours = ("COMPILE_CACHE", "launcher", str(node.parent))
    assert not [line for line in environment if any(part in line for part in ours)]
    system = subprocess.run(["node", "--version"], capture_output=True, text=True)
    assert node_version == system.stdout.strip()


def test_a_rejected_submit_goes_back_to_the_model_which_corrects_it_in_the_same_session(
    pi_host, model_server
):
    pi_host.harness.write_workflow("counted", COUNTED)
    model_server.script(submit({"count": "three"}), submit({"count": 3}))
    run_id = pi_host.start_headless("counted")
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"count": 3}
    first, second = model_server.requests
    (rejection,) = second.tool_results()
    assert "count must be an integer, not 'three'" in rejection["content"]
    # The same Pi session: the correction request still carries the original prompt.
    assert second.user_texts() == first.user_texts()


def test_a_model_that_keeps_going_after_an_accepted_submit_is_stopped(pi_host, model_server):
    def submit_and_read(request):
        (call,) = submit({"reply": "done"})(request).calls
        return ToolCalls(call, ToolCall("bash", {"command": "true"}))

    model_server.script(submit_and_read, Hold())
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"reply": "done"}
    assert len(model_server.requests) == 2


def test_a_model_that_never_submits_gets_two_reminders_then_the_step_fails(pi_host, model_server):
    model_server.script(Text("I will get to it."), Text("Soon."), Text("Still thinking."))
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    status = _finished(pi_host, run_id)
    assert status["status"] == "failed", status
    assert "missingSubmission" in status["error"]
    assert len(model_server.requests) == 3
    reminders = [request.last_user_text() for request in model_server.requests[1:]]
    assert reminders[0].startswith("Reminder 1 of 2")
    assert reminders[1].startswith("Reminder 2 of 2")
    assert all('"action":"submit","step":"reply"' in text for text in reminders)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(None, id="server-down"),
        pytest.param(HttpError(401, "invalid api key"), id="http-401"),
        pytest.param(HttpError(500, "upstream exploded"), id="http-500"),
        pytest.param(MalformedStream(), id="malformed-stream"),
    ],
)
def test_a_provider_error_fails_the_step_with_one_line_naming_provider_and_model(
    pi_host, model_server, failure
):
    if failure is None:
        model_server.stop()
    else:
        model_server.script(failure)
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    status = _finished(pi_host, run_id, timeout=30)
    assert status["status"] == "failed", status
    assert "The model scripted/scripted-model failed:" in status["error"]
    assert "\n" not in status["error"]
    if isinstance(failure, HttpError):
        assert str(failure.status) in status["error"]


def _transcripts(pi_host, run_id):
    return json.loads(pi_host.harness.cli("run", "transcript", run_id, "--json").stdout)


def _saved(pi_host, run_id, *kinds):
    """Wait until the running attempt's saved transcript holds entries of `kinds`, in order."""

    def saved():
        transcripts = _transcripts(pi_host, run_id)
        found = [entry["kind"] for entry in transcripts[-1]["entries"]] if transcripts else []
        return found[: len(kinds)] == list(kinds)

    wait_until(saved, timeout=30, what=f"the running attempt's transcript to hold {kinds}")


def _stopped_attempt(transcript, reason):
    """The entries of an attempt whose worker was stopped first, checked for its end marker."""
    assert transcript["complete"] is False, transcript
    *entries, ended = transcript["entries"]
    assert (ended["kind"], ended["reason"]) == ("ended", reason), ended
    assert "the worker was stopped before the attempt ended" in ended["text"]
    return entries


def test_cancel_mid_step_ends_pi_and_the_command_its_tool_started(pi_host, model_server):
    model_server.script(ToolCalls(ToolCall("bash", {"command": "sleep 300"})))
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    processes = _tool_command_running(pi_host, "sleep")
    _saved(pi_host, run_id, "prompt", "tool_call")
    pi_host.harness.cli("run", "cancel", run_id)
    status = _finished(pi_host, run_id)
    assert status["status"] == "cancelled", status
    for process in processes:
        wait_until(lambda p=process: process_gone(p.pid), what=f"process {process.pid} to end")
    assert pi_host.pi_home.processes() == []
    # The cancelled attempt keeps what the agent did until its worker was stopped.
    (transcript,) = _transcripts(pi_host, run_id)
    assert transcript["outcome"] == "cancelled"
    prompt, call = _stopped_attempt(transcript, "cancel")
    assert "Say hello" in prompt["text"]
    assert call["name"] == "bash" and call["arguments"] == {"command": "sleep 300"}


def test_a_node_timeout_mid_step_ends_pi(pi_host, model_server):
    pi_host.harness.write_workflow("slow-step", SLOW_STEP.replace("TIMEOUT_MS", "6000"))
    model_server.script(Hold())
    run_id = pi_host.start_headless("slow-step")
    _pi_processes_running(pi_host)
    status = _finished(pi_host, run_id)
    assert status["status"] == "timed_out", status
    wait_until(lambda: pi_host.pi_home.processes() == [], what="every pi process to end")
    # Whether the deadline caught pi starting or waiting for the model, the stored
    # transcript (if pi got as far as the prompt) ends with the timeout.
    for transcript in json.loads(pi_host.harness.cli("run", "transcript", run_id, "--json").stdout):
        assert transcript["outcome"] == "timed_out"
        assert transcript["entries"][-1]["kind"] == "ended"
        assert transcript["entries"][-1]["reason"] == "timeout"


def test_pause_mid_step_ends_pi_and_resume_runs_the_step_again(pi_host, model_server):
    model_server.script(Hold(), submit({"reply": "after the pause"}))
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    model_server.wait_for_requests(1, timeout=60)
    processes = _pi_processes_running(pi_host)
    _saved(pi_host, run_id, "prompt")
    pi_host.harness.cli("run", "pause", run_id)
    for process in processes:
        wait_until(lambda p=process: process_gone(p.pid), what=f"pi process {process.pid} to end")
    paused = json.loads(pi_host.harness.cli("run", "status", run_id, "--json").stdout)
    assert paused["paused"] and paused["status"] != "completed"
    pi_host.harness.cli("run", "resume", run_id)
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"reply": "after the pause"}
    paused_attempt, resumed_attempt = _transcripts(pi_host, run_id)
    assert paused_attempt["outcome"] == "interrupted"
    assert [e["kind"] for e in _stopped_attempt(paused_attempt, "stopped")] == ["prompt"]
    assert (resumed_attempt["outcome"], resumed_attempt["complete"]) == ("completed", True)


@pytest.mark.scenario("3.13")
def test_worker_sigkill_mid_step_leaves_no_pi_behind_and_the_step_runs_again(pi_host, model_server):
    model_server.script(
        ToolCalls(ToolCall("bash", {"command": "sleep 300"})),
        submit({"reply": "second time lucky"}),
    )
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    processes = _tool_command_running(pi_host, "sleep")
    _saved(pi_host, run_id, "prompt", "tool_call")
    (_, _, worker_pid), *_ = pi_host.harness.workers(run_id)
    os.kill(worker_pid, signal.SIGKILL)
    for process in processes:
        wait_until(lambda p=process: process_gone(p.pid), what=f"process {process.pid} to end")
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"reply": "second time lucky"}
    first, second = model_server.requests
    assert _attempt_of(first) != _attempt_of(second), "the step ran again as a new attempt"
    # The killed worker's attempt keeps what it had saved; the new attempt has it all.
    killed, rerun = _transcripts(pi_host, run_id)
    assert killed["outcome"] == "interrupted"
    assert [e["kind"] for e in _stopped_attempt(killed, "stopped")] == ["prompt", "tool_call"]
    assert (rerun["outcome"], rerun["complete"]) == ("completed", True)


def _attempt_of(request):
    return request.user_texts()[0].split("attempt: ")[1].split(")")[0]


def test_two_agent_steps_share_one_pi_with_a_fresh_session_each(pi_host, model_server):
    model_server.script(
        submit({"findings": ["a", "b"], "repoSummary": "small"}),
        submit({"draft": "plan"}),
        submit({"checklist": ["x"], "references": ["y"]}),
    )
    run_id = pi_host.start_headless("two-turn")
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"]["draft"] == {"draft": "plan"}
    requests = model_server.requests
    assert [len(request.user_texts()) for request in requests] == [1, 1, 1]
    assert "Findings:" in requests[1].last_user_text()


def test_run_transcript_shows_what_the_agent_did_in_each_attempt(pi_host, model_server):
    pi_host.harness.write_workflow("counted", COUNTED)
    model_server.script(
        workflow_call("update", update={"type": "progress", "key": "files", "data": {"n": 1}}),
        submit({"count": "three"}),
        submit({"count": 3}),
    )
    run_id = pi_host.start_headless("counted")
    assert _finished(pi_host, run_id)["status"] == "completed"

    text = pi_host.harness.cli("run", "transcript", run_id).stdout
    assert text.startswith("== count attempt 1 (completed) ==")
    assert "prompt model=scripted-model provider=scripted reason=initial" in text
    assert "Count the files." in text
    assert "tool_call" in text and '"action": "update"' in text
    assert "Update published" in text
    assert "isError=true" in text and "count must be an integer" in text
    assert "Accepted: the workflow step is complete." in text

    (transcript,) = json.loads(
        pi_host.harness.cli("run", "transcript", run_id, "--node", "count", "--json").stdout
    )
    kinds = [entry["kind"] for entry in transcript["entries"]]
    assert kinds == [
        "prompt",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
    ]
    assert transcript["nodeId"] == "count" and transcript["outcome"] == "completed"
    nothing = pi_host.harness.cli("run", "transcript", run_id, "--node", "other", "--json")
    assert json.loads(nothing.stdout) == []


@pytest.mark.parametrize("failure", ["server-down", "http-503"])
def test_a_failing_provider_fails_the_step_within_seconds_with_pis_default_retries(
    harness, model_server, pi_bin, failure
):
    """Pi retries a 5xx or refused connection itself (2, 4, 8 s: 14 s) unless told not to;
    a headless step must not wait for that: it fails on the first failed model turn."""
    pi_host = PiHost(harness, PiHome(harness.root / "pi", model_server, retries_off=False))
    harness.start_host()
    if failure == "server-down":
        model_server.stop()
    else:
        model_server.script(*[HttpError(503, "overloaded")] * 12)
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    if failure == "http-503":
        model_server.wait_for_requests(1, timeout=60)  # pi has started: the clock starts now
        status = _finished(pi_host, run_id, timeout=FAIL_FAST_SECONDS)
    else:
        status = _finished(pi_host, run_id, timeout=60)
    assert status["status"] == "failed", status
    assert status["error"].startswith("Node 'reply' failed: The model scripted/scripted-model ")
    assert "\n" not in status["error"]
    (transcript,) = json.loads(pi_host.harness.cli("run", "transcript", run_id, "--json").stdout)
    prompt, *_, error = transcript["entries"]
    assert (prompt["kind"], error["kind"]) == ("prompt", "error")
    # From the prompt to the failure: the provider SDK's own quick retries, not Pi's 14 s.
    assert error["at"] - prompt["at"] < FAIL_FAST_SECONDS * 1000


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        pytest.param(
            "scripted/nope",
            "Pi does not know the model scripted/nope (PI_WORKFLOWS_PI_MODEL=scripted/nope): "
            "provider scripted has scripted/scripted-model; `pi --list-models` lists the models "
            "Pi can use.",
            id="model",
        ),
        # Pi refuses an unknown provider itself; its own line names the model.
        pytest.param(
            "elsewhere/nope",
            'pi exited with code 1: Error: Model "elsewhere/nope" not found. Use --list-models',
            id="provider",
        ),
    ],
)
def test_a_model_pi_does_not_know_fails_the_step_naming_it(
    harness, model_server, pi_bin, model, reason
):
    """Pi only warns about an unknown model of a known provider and sends the name to the
    provider anyway (a scripted server answers anything): the step must fail first."""
    pi_host = PiHost(harness, PiHome(harness.root / "pi", model_server))
    harness.env["PI_WORKFLOWS_PI_MODEL"] = model
    harness.start_host()
    model_server.script(submit({"reply": "from a model that does not exist"}))
    run_id = pi_host.start_headless("echo", {"task": "Say hello"})
    status = _finished(pi_host, run_id)
    assert status["status"] == "failed", status
    assert reason in status["error"] and "\n" not in status["error"]
    assert model_server.requests == []


def test_a_runs_pi_starts_with_the_run_so_earlier_work_overlaps_its_start_up(pi_host, model_server):
    pi_host.harness.write_workflow("agent-after-work", AGENT_AFTER_WORK)
    model_server.script(submit({"reply": "ready when you were"}))
    run_id = pi_host.start_headless("agent-after-work")
    # The compute step is still working: no agent step yet, but its pi is already up.
    _pi_processes_running(pi_host)
    assert model_server.requests == []
    (pi_host.harness.project / "go").touch()
    status = _finished(pi_host, run_id)
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"reply": "ready when you were"}
    wait_until(lambda: pi_host.pi_home.processes() == [], what="the run's pi to end")
