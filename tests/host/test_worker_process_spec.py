"""`WorkerProcessSpec` env, nice and rlimits from a launch plugin, seen by the workflow's
own code in a running host: on a forked worker (the fork server is kept) and on a command
of the plugin's own."""

from __future__ import annotations

import os
import resource

import pytest

from pi_workflows.host.lock import live_lock_holder

from .conftest import HostHarness, wait_until

# Reports what the node's process runs with.
REPORT = """
import os
import resource

from pi_workflows import compute, workflow


def report(ctx):
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "extra": os.environ.get("PIW_TEST_EXTRA"),
        "parent": os.getppid(),
    }


WORKFLOW = workflow(name="report", start_at="report", nodes={"report": compute(report)}, edges=[])
"""

LIMITING = """
import dataclasses
import os

from pi_workflows.plugin import default_worker_process, hookimpl


@hookimpl
def piw_worker_process(envelope, settings):
    spec = default_worker_process(envelope, settings)
    if os.environ.get("PIW_TEST_OWN_COMMAND"):
        # A command of the plugin's own: the same worker, not recognised as forkable.
        spec = dataclasses.replace(spec, argv=["/bin/sh", "-c", 'exec "$0" "$@"', *spec.argv],
                                   forkable=False)
    return dataclasses.replace(
        spec,
        env={**spec.env, "PIW_TEST_EXTRA": "from the plugin"},
        nice=3,
        rlimits={"RLIMIT_NOFILE": (200, 300)},
    )
"""


@pytest.mark.parametrize("command", ["forked", "own command"])
def test_a_launch_plugin_sets_the_workers_environment_niceness_and_limits(
    harness: HostHarness, command: str
):
    harness.write_workflow("report", REPORT)
    harness.add_plugin("limiting", LIMITING)
    extra = {"PIW_TEST_OWN_COMMAND": "1"} if command == "own command" else {}
    harness.start_host(**extra)
    run_id = harness.start_run("report")
    output = harness.wait_for_status(run_id, "completed")["finalOutput"]

    host_nice = os.getpriority(os.PRIO_PROCESS, 0)  # the host inherits the test's
    assert output["nice"] == min(19, host_nice + 3)
    assert output["nofile"] == [200, 300]
    assert output["extra"] == "from the plugin"
    host_pid = live_lock_holder(harness.home.lock_path)["pid"]
    if command == "forked":
        assert output["parent"] != host_pid  # forked from the fork server, not spawned
    else:
        assert output["parent"] == host_pid
    # The host itself runs as before.
    assert resource.getrlimit(resource.RLIMIT_NOFILE) != (200, 300)


def test_a_launch_plugin_with_a_limit_that_does_not_exist_fails_the_launch_in_one_line(
    harness: HostHarness,
):
    harness.add_plugin(
        "bad_limits",
        """
import dataclasses

from pi_workflows.plugin import default_worker_process, hookimpl


@hookimpl
def piw_worker_process(envelope, settings):
    spec = default_worker_process(envelope, settings)
    return dataclasses.replace(spec, rlimits={"RLIMIT_WISHES": (1, 1)})
""",
    )
    harness.start_host()
    run_id = harness.start_run("hello")
    line = wait_until(
        lambda: next(
            (
                line
                for line in harness.host_log().splitlines()
                if "'RLIMIT_WISHES' is not a resource limit here" in line
            ),
            None,
        ),
        what="the launch to fail on the bad limit",
    )
    assert "Plugin 'bad_limits' failed in hook piw_worker_process" in line
    assert run_id in line  # the run whose worker did not start, and nothing of its input
    assert harness.client().run_status(run_id)["status"] != "completed"
