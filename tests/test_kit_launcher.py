"""The test kit's launcher: commands and hosts forked from one warm process behave as
exec'd ones do, and whatever it cannot take on is exec'd."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from pi_workflows.testing import (
    InProcessHost,
    WorkflowHome,
    WorkflowHost,
    launcher,
    short_temp_dir,
    wait_until,
)
from pi_workflows.testing.launcher import LaunchedProcess


@pytest.fixture
def home() -> Iterator[WorkflowHome]:
    home = WorkflowHome(short_temp_dir())
    try:
        yield home
    finally:
        home.cleanup()


def _exec(home: WorkflowHome, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    console = [str(launcher.console_script()), *args]
    return subprocess.run(
        console,
        env={**home.env, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=home.project,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--version",),
        ("run", "list", "--no-autostart"),  # no host: refused in one line, exit 1
        ("run", "start", "--no-such-option"),  # click's usage error, exit 2
        ("config", "get", "max_workers"),
        ("plugins",),  # the plugin module on the home's PYTHONPATH loads
        ("workflows",),
    ],
)
def test_a_forked_command_prints_and_exits_as_an_execd_one(home: WorkflowHome, args):
    home.add_plugin("kit_probe", "'''A plugin module found through PYTHONPATH.'''\n")
    forked = home.run_cli(*args, env={"PI_WORKFLOWS_MAX_WORKERS": "3"})
    execd = _exec(home, *args, PI_WORKFLOWS_MAX_WORKERS="3")
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        execd.returncode,
        execd.stdout,
        execd.stderr,
    )


def test_each_command_has_its_own_environment_and_working_directory(home: WorkflowHome):
    seven = home.run_cli("config", "get", "max_workers", env={"PI_WORKFLOWS_MAX_WORKERS": "7"})
    assert seven.stdout.strip() == "7", seven
    # The variable of the command before does not stay behind in the launcher.
    assert home.run_cli("config", "get", "max_workers").stdout.strip() == "4"
    # Workflows are found from the working directory, as for any command.
    home.write_workflow(
        "mine",
        """
        from pi_workflows import compute, workflow

        WORKFLOW = workflow("mine", "a", {"a": compute(lambda ctx: 1)}, [])
        """,
    )
    listed = home.run_cli("workflows")
    assert "mine" in listed.stdout, listed


@pytest.mark.integration
def test_a_forked_host_is_signalled_waited_for_and_reports_its_exit(
    workflow_host: WorkflowHost,
):
    process = workflow_host.start()
    assert isinstance(process, LaunchedProcess)
    assert psutil.Process(process.pid).ppid() != os.getpid()  # the launcher's child
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    run_id = workflow_host.start_run("hello", {"name": "fork"})
    assert workflow_host.wait_for_status(run_id, "completed")["status"] == "completed"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0  # a host stopped by SIGTERM exits cleanly

    again = workflow_host.start()
    again.kill()
    assert again.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.integration
def test_a_host_asked_for_as_a_child_is_execd_as_one(workflow_host: WorkflowHost):
    workflow_host.host_as_child = True
    process = workflow_host.start()
    assert isinstance(process, subprocess.Popen)
    assert psutil.Process(process.pid).ppid() == os.getpid()


def test_an_environment_that_changes_interpreter_start_up_is_execd(home: WorkflowHome):
    # PYTHONSAFEPATH drops the script's folder from sys.path: only a new interpreter obeys.
    with open(home.root / "host.log", "ab") as log:
        process = launcher.start(
            ["--version"], env={**home.env, "PYTHONSAFEPATH": "1"}, cwd=home.project, log=log
        )
    assert isinstance(process, subprocess.Popen)
    assert process.wait(timeout=60) == 0


def test_a_command_past_its_timeout_is_killed(home: WorkflowHome):
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.run(["host", "run"], env=home.env, cwd=home.project, module=True, timeout=1)
    # The killed host leaves its lock to nobody: the next one starts.
    wait_until(lambda: home.run_cli("host", "status").returncode == 0, what="host status")


@pytest.mark.integration
def test_a_killed_launcher_is_replaced_by_the_next_command(home: WorkflowHome):
    first = launcher.shared_launcher()
    assert first is not None
    first.process.kill()
    first.process.wait(timeout=30)
    wait_until(lambda: not first.alive, what="the launcher's end to be noticed")
    result = home.run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip()
    assert launcher.shared_launcher() is not first


def _fork_servers(parent: int) -> list[psutil.Process]:
    """The live worker fork servers (`--zygote`) among `parent`'s children."""
    found = []
    for child in psutil.Process(parent).children():
        try:
            if "--zygote" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            pass  # it ended meanwhile
    return found


def test_an_in_process_hosts_fork_server_is_forked_by_the_launcher(
    in_process_host: InProcessHost,
):
    kit_launcher = launcher.shared_launcher()
    assert kit_launcher is not None
    in_process_host.start()
    # Before any launch: one fork server-to-be, the launcher's child, none of this process's.
    (standby,) = wait_until(
        lambda: _fork_servers(kit_launcher.process.pid), what="the host's fork server-to-be"
    )
    assert not _fork_servers(os.getpid())
    assert os.getpgid(standby.pid) == standby.pid

    run_id = in_process_host.start_run("hello", {"name": "Ada"})
    assert in_process_host.wait_for_run(run_id)["finalOutput"] == {"greeting": "Hello, Ada!"}
    # The run's worker came from that very process, now serving in the host's home.
    [(worker_pid,)] = in_process_host.query("SELECT pid FROM run_workers WHERE run_id = ?", run_id)
    assert worker_pid != os.getpid()
    assert _fork_servers(kit_launcher.process.pid) == [standby]
    assert standby.cwd() == str(in_process_host.home.root)
    assert not _fork_servers(os.getpid())

    in_process_host.stop()
    wait_until(lambda: not standby.is_running(), what="the fork server to end with its host")


def test_an_in_process_host_told_to_exec_starts_its_fork_server_itself(
    in_process_host: InProcessHost, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(launcher.MODE_ENV, "exec")
    in_process_host.start()
    run_id = in_process_host.start_run("hello", {"name": "Ada"})
    assert in_process_host.wait_for_run(run_id)["status"] == "completed"
    # A new interpreter, this process's child, as every command is then.
    (zygote,) = _fork_servers(os.getpid())
    assert zygote.cmdline()[1:] == ["-m", "pi_workflows.worker", "--zygote"]
    in_process_host.stop()
    wait_until(lambda: not zygote.is_running(), what="the fork server to end with its host")


@pytest.mark.integration
def test_a_fork_server_whose_launcher_died_ends_with_an_unknown_status(home: WorkflowHome):
    kit_launcher = launcher.shared_launcher()
    assert kit_launcher is not None

    async def orphaned_standby_ends() -> int:
        standby = kit_launcher.fork_server_standby(home.env, home.root)
        assert standby is not None
        kit_launcher.process.kill()
        kit_launcher.process.wait(timeout=30)
        standby.control.close()  # as its host closes it: it reads end-of-file and exits
        return await asyncio.wait_for(standby.process.wait(), 30)

    # Its parent is gone, so nobody reports its exit status: it is unknown, not an error.
    assert asyncio.run(orphaned_standby_ends()) == -1
    assert launcher.shared_launcher() is not kit_launcher
