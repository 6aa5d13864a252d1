"""Inputs at the door: files and stdin, limits, and one clear line for every bad value."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.client import WorkflowClient
from pi_workflows.client.connection import HostConnection
from pi_workflows.errors import InvalidInputError
from pi_workflows.limits import MAX_INPUT_BYTES
from pi_workflows.testing import WorkflowHome as HomeEnv
from pi_workflows.testing import wait_until
from tests.host.workflows import CHECKPOINTED

BIG_OUTPUT = """
from pi_workflows import compute, workflow

WORKFLOW = workflow("big", "a", {"a": compute(lambda ctx: {"blob": "x" * 5_000_000})}, [])
"""


@pytest.fixture
def hosted(home_env: HomeEnv) -> Iterator[HomeEnv]:
    home_env.run_cli("host", "start")
    try:
        yield home_env
    finally:
        home_env.run_cli("host", "stop")


def _one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_input_file_and_stdin_carry_the_input(hosted: HomeEnv, tmp_path: Path):
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"name": "File"}))
    from_file = hosted.run_cli("run", "start", "hello", "--input-file", str(path), "--wait")
    assert "Hello, File!" in from_file.stdout
    from_stdin = subprocess.run(
        [
            str(Path(sys.executable).with_name("pi-workflows")),
            "run",
            "start",
            "hello",
            "--input-file",
            "-",
            "--wait",
        ],
        input=json.dumps({"name": "Stdin"}),
        env=hosted.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Hello, Stdin!" in from_stdin.stdout, from_stdin.stderr
    both = hosted.run_cli("run", "start", "hello", "--input-file", str(path), "--input-json", "{}")
    assert both.returncode == 2 and "not both" in both.stderr


def test_checkpoint_answer_reads_its_answer_from_a_file(hosted: HomeEnv, tmp_path: Path):
    project = tmp_path / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "checkpointed.workflow.py").write_text(CHECKPOINTED)
    waiting = hosted.run_cli(
        "run", "start", "checkpointed", "--project", str(project), "--wait", "--json"
    )
    assert waiting.returncode == 0  # waiting at a checkpoint is a successful wait
    run_id = json.loads(waiting.stdout)["runId"]
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"approved": True}))
    continuation = hosted.run_cli("checkpoint", "answer", run_id, "--input-file", str(answer))
    assert continuation.returncode == 0, continuation.stderr
    child = continuation.stdout.strip()
    nan = hosted.run_cli("checkpoint", "answer", run_id, "--input-json", "[NaN]")
    _one_line_error(nan, "NaN")
    # The answer in the file is what the checkpoint's continuation carried on with.
    status = wait_until(
        lambda: (
            (s := json.loads(hosted.run_cli("run", "status", child, "--json").stdout))["status"]
            not in ("queued", "running")
            and s
        ),
        what="the continuation to finish",
    )
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"answer": {"approved": True}}


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('{"name": NaN}', ("--input-file", "NaN")),
        ("[" * 5000 + "]" * 5000, ("nested more than 64 levels",)),
        (json.dumps({"name": "x" * (MAX_INPUT_BYTES + 1)}), ("the limit is 512 KiB",)),
        ('{"name": ', ("not valid JSON",)),
    ],
    ids=["nan", "deep", "oversize", "malformed"],
)
def test_bad_inputs_are_one_line_and_create_nothing(hosted: HomeEnv, text, needles, tmp_path):
    path = tmp_path / "input.json"
    path.write_text(text)
    result = hosted.run_cli("run", "start", "hello", "--input-file", str(path), "--wait")
    _one_line_error(result, *needles)
    assert json.loads(hosted.run_cli("run", "list", "--json").stdout) == []


def test_the_host_refuses_inputs_over_the_limits_itself(hosted: HomeEnv):
    # A client that skips the CLI's checks gets the same answer from the host.
    with HostConnection(hosted.home.socket_path) as connection:
        payload = {
            "workflowName": "hello",
            "workflowRef": "hello",
            "workflowSource": {"kind": "builtin", "id": "hello", "revision": "r"},
            "definitionDigest": "d",
            "projectPath": "/",
        }
        big = connection.request("run.start", {**payload, "input": {"x": "y" * 900_000}})
        assert big.outcome == "rejected" and "the limit is 512 KiB" in big.error
        deep: object = 1
        for _ in range(200):
            deep = [deep]
        nested = connection.request("run.start", {**payload, "input": deep})
        assert nested.outcome == "rejected" and "nested more than 64" in nested.error
    assert json.loads(hosted.run_cli("run", "list", "--json").stdout) == []


def test_a_wait_that_runs_out_is_one_line(hosted: HomeEnv, tmp_path: Path):
    project = tmp_path / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "slow.workflow.py").write_text(
        "import time\nfrom pi_workflows import compute, workflow\n"
        "WORKFLOW = workflow('slow', 'a', {'a': compute(lambda ctx: time.sleep(60))}, [])\n"
    )
    result = hosted.run_cli(
        "run", "start", "slow", "--project", str(project), "--wait", "--timeout", "0.5"
    )
    _one_line_error(result, "after waiting 0.5 s", "pi-workflows run status")
    run_id = json.loads(hosted.run_cli("run", "list", "--json").stdout)[0]["runId"]
    hosted.run_cli("run", "cancel", run_id)


def test_a_node_output_over_the_limit_fails_its_node_once(hosted: HomeEnv, tmp_path: Path):
    project = tmp_path / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "big.workflow.py").write_text(BIG_OUTPUT)
    result = hosted.run_cli("run", "start", "big", "--project", str(project), "--wait", "--json")
    status = json.loads(result.stdout)
    assert result.returncode == 1
    assert status["status"] == "failed", status
    assert "The output of node 'a' is 4.8 MiB; the limit is 512 KiB" in status["error"]
    # The run failed with its node's write; its worker then exits (a moment later on a
    # loaded machine), and none is launched again.
    wait_until(
        lambda: json.loads(hosted.run_cli("host", "status", "--json").stdout)["activeWorkers"] == 0,
        what="the failed run's worker to exit",
    )


def test_a_request_over_the_frame_limit_is_refused_before_it_is_sent(hosted: HomeEnv):
    client = WorkflowClient(hosted.home, autostart=False)
    try:
        with pytest.raises(InvalidInputError, match="over the 1 MiB protocol limit"):
            client.call("run.list", {"padding": "x" * (1024 * 1024)})
        # The same connection still works: nothing was sent.
        assert client.list_runs() == []
    finally:
        client.close()


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "soon"])
def test_a_timeout_that_is_not_a_duration_is_refused(hosted: HomeEnv, value: str):
    result = hosted.run_cli("run", "start", "hello", "--wait", "--timeout", value)
    _one_line_error(result, "--timeout must be a number of seconds, 0 or more", repr(value))
    assert json.loads(hosted.run_cli("run", "list", "--json").stdout) == []
    watched = hosted.run_cli("session", "next", "s-1", "--timeout", value)
    _one_line_error(watched, "--timeout must be a number of seconds")


@pytest.mark.parametrize("option", ["--input-json", "--input-file"])
def test_a_repeated_key_in_the_input_is_refused_by_name(
    hosted: HomeEnv, option: str, tmp_path: Path
):
    text = '{"name": "Ada", "nested": {"x": 1, "x": 2}}'
    path = tmp_path / "input.json"
    path.write_text(text)
    value = text if option == "--input-json" else str(path)
    result = hosted.run_cli("run", "start", "hello", option, value, "--wait")
    _one_line_error(result, option, "gives the key 'x' twice")
    assert json.loads(hosted.run_cli("run", "list", "--json").stdout) == []


HELD = """
import time
from pathlib import Path

from pi_workflows import compute, workflow


def hold(ctx):
    Path("started").touch()
    deadline = time.monotonic() + 60
    while not Path("release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return "released"


WORKFLOW = workflow("held", "hold", {"hold": compute(hold)}, [])
"""


def test_a_wait_returns_when_the_run_is_paused(hosted: HomeEnv, tmp_path: Path):
    """`run start --wait` ends, exit 1, when someone pauses the run meanwhile (issue 30.7)."""
    project = tmp_path / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "held.workflow.py").write_text(HELD)
    console = str(Path(sys.executable).with_name("pi-workflows"))
    for as_json in (False, True):
        (project / "started").unlink(missing_ok=True)
        waiting = subprocess.Popen(
            [console, "run", "start", "held", "--project", str(project), "--wait"]
            + (["--json"] if as_json else []),
            env=hosted.env,
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: (project / "started").exists(), what="the run's node to start")
            run_id = json.loads(hosted.run_cli("run", "list", "--json").stdout)[0]["runId"]
            paused = hosted.run_cli("run", "pause", run_id)
            assert paused.returncode == 0, paused.stderr
            out, err = waiting.communicate(timeout=60)
        finally:
            waiting.kill()
        assert waiting.returncode == 1, (out, err)
        if as_json:
            status = json.loads(out)
            assert status["runId"] == run_id and status["paused"] is True
        else:
            assert out.startswith(f"{run_id}: ") and "(paused: resume it with" in out
    (project / "release").touch()
