"""One bad workflow file never breaks its project: each file loads under a deadline and a
memory limit, in a child that dies with its parent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pi_workflows.testing import WorkflowHome as HomeEnv
from tests.polling import process_gone, wait_until

GOOD = """
from pi_workflows import compute, workflow

WORKFLOW = workflow("good", "a", {"a": compute(lambda ctx: {"ok": True})}, [])
"""

BAD_FILES = {
    "loops": "while True:\n    pass\n",
    "exits": "import sys\nsys.exit(0)\n",
    "hog": "hoard = bytearray(4 * 1024 ** 3)\n",
    "suicide": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
}

LIMITS = {"PI_WORKFLOWS_DISCOVERY_TIMEOUT_S": "2", "PI_WORKFLOWS_DISCOVERY_MEMORY_MB": "1024"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "project" / ".pi" / "workflows"
    directory.mkdir(parents=True)
    (directory / "good.workflow.py").write_text(GOOD)
    for stem, source in BAD_FILES.items():
        (directory / f"{stem}.workflow.py").write_text(source)
    return tmp_path / "project"


def test_broken_and_hostile_files_are_listed_with_their_reason(home_env: HomeEnv, project: Path):
    result = home_env.run_cli("workflows", "--json", "--project", str(project), env=LIMITS)
    assert result.returncode == 0, result.stderr
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert "error" not in listed["good"] and listed["good"]["definitionDigest"]
    assert "did not finish loading within 2 s" in listed["loops"]["error"]
    assert "called sys.exit(0) while loading" in listed["exits"]["error"]
    assert "ran out of memory while loading" in listed["hog"]["error"]
    assert "ended its process (signal 9) while loading" in listed["suicide"]["error"]
    assert listed["hello"]["source"]["kind"] == "builtin"  # registered workflows still load
    assert all("\n" not in (entry.get("error") or "") for entry in listed.values())


def test_run_start_of_a_good_workflow_ignores_the_bad_ones(home_env: HomeEnv, project: Path):
    try:
        started = home_env.run_cli(
            "run", "start", "good", "--project", str(project), "--wait", env=LIMITS
        )
        assert started.returncode == 0, started.stderr
        assert '"ok": true' in started.stdout
        for stem, reason in (("exits", "sys.exit"), ("loops", "within 2 s")):
            refused = home_env.run_cli("run", "start", stem, "--project", str(project), env=LIMITS)
            assert refused.returncode == 1
            assert reason in refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        runs = json.loads(home_env.run_cli("run", "list", "--json").stdout)
        assert [run["workflowName"] for run in runs] == ["good"]
    finally:
        home_env.run_cli("host", "stop")


def test_a_killed_cli_leaves_no_discovery_process_behind(home_env: HomeEnv, project: Path):
    cli = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("pi-workflows")),
            "workflows",
            "--project",
            str(project),
        ],
        env={**home_env.env, "PI_WORKFLOWS_DISCOVERY_TIMEOUT_S": "120"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Wait until the resolver has forked a loader (it spins in the looping file), then
    # kill the CLI outright.
    descendants = wait_until(
        lambda: len(found := psutil.Process(cli.pid).children(recursive=True)) >= 2 and found,
        what="the resolver and a loader child",
    )
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    try:
        pids = [child.pid for child in descendants]
        wait_until(lambda: all(map(process_gone, pids)), timeout=10, what=f"{pids} to die")
    finally:
        for child in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_a_worker_that_hangs_importing_its_workflow_is_stopped(home_env: HomeEnv, tmp_path: Path):
    project = tmp_path / "hang-project"
    directory = project / ".pi" / "workflows"
    directory.mkdir(parents=True)
    # Hangs only in a worker (the client resolves it with no launch envelope).
    (directory / "stuck.workflow.py").write_text(
        "import os, time\n"
        "if 'PI_WORKFLOWS_WORKER_LAUNCH' in os.environ:\n"
        "    open('worker.pid', 'w').write(str(os.getpid()))\n"
        "    time.sleep(600)\n" + GOOD.replace('"good"', '"stuck"')
    )
    env = {"PI_WORKFLOWS_WORKER_STARTUP_S": "2", "PI_WORKFLOWS_POLL_S": "0.1"}
    try:
        home_env.run_cli("host", "start", env=env)
        result = home_env.run_cli(
            "run", "start", "stuck", "--project", str(project), "--wait", "--json", env=env
        )
        status = json.loads(result.stdout)
        assert status["errorCode"] == "workerNoProgress", status
        assert "timedOut" in status["statusDetail"]
        assert result.returncode == 1
        worker_pid = int((project / "worker.pid").read_text())
        wait_until(lambda: process_gone(worker_pid), timeout=10, what="the stuck worker to die")
    finally:
        home_env.run_cli("host", "stop")


def test_a_broken_files_verdict_is_remembered_until_the_file_or_the_limits_change(
    home_env: HomeEnv, tmp_path: Path
):
    directory = tmp_path / "project" / ".pi" / "workflows"
    directory.mkdir(parents=True)
    imports = tmp_path / "imports"
    hangs = directory / "hangs.workflow.py"
    hangs.write_text(f"open({str(imports)!r}, 'a').write('x')\nwhile True:\n    pass\n")
    home_env.home.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def listed(**limits: str) -> dict:
        result = home_env.run_cli(
            "workflows", "--json", "--project", str(tmp_path / "project"), env={**LIMITS, **limits}
        )
        assert result.returncode == 0, result.stderr
        return {entry["name"]: entry for entry in json.loads(result.stdout)}["hangs"]

    first = listed()
    assert "did not finish loading within 2 s" in first["error"]
    assert listed() == first
    assert imports.read_text() == "x"  # the second listing did not load it again
    cache = home_env.home.root / "cache" / "broken-workflows.json"
    assert cache.stat().st_mode & 0o777 == 0o600
    assert str(hangs.resolve()) in json.loads(cache.read_text())
    # Another deadline, or a touched file, is another question: loaded again.
    assert "within 1 s" in listed(PI_WORKFLOWS_DISCOVERY_TIMEOUT_S="1")["error"]
    assert imports.read_text() == "xx"
    os.utime(hangs)
    listed()
    assert imports.read_text() == "xxx"
    hangs.write_text(GOOD)  # fixed: it loads, and its verdict is forgotten
    assert "error" not in listed()
    assert str(hangs.resolve()) not in json.loads(cache.read_text())
