"""The pi-workflows test kit: what a plugin's tests need, and what this repository uses.

Installed with pi-workflows as a pytest plugin (entry point ``pytest11``), so its
fixtures are available in any test suite of an environment that has pi-workflows:

- ``workflow_plugins``: the process-wide plugin manager with the built-ins only
  (installed entry-point plugins do not leak in); ``.register(plugin)`` for one test;
- ``workflow_home``: a private state home, config dir and project, set in this process's
  environment, with ``run_cli(...)`` for the command line;
- ``workflow_host``: a real host in a private home (not started: write workflows and
  plugins first, then ``start()``), with helpers to start runs and wait for them;
- ``in_process_host``: the same with the host's loop in a thread of the test process
  (:class:`InProcessHost`: real socket, database and workers; no host process to kill),
  much quicker to start — for every test that does not kill, signal or restart the host.

The record factories (:func:`run_record`, :func:`terminal_facts`, :func:`turn_report`,
:func:`channel_context`, …) and :func:`wait_until` are plain functions; import them.
"""

from .crash_points import CrashCase, CrashPoints, channel_effects
from .factories import (
    AnswerRecorder,
    channel_context,
    claim,
    host_info,
    run_record,
    terminal_facts,
    turn_report,
)
from .host import WorkflowHome, WorkflowHost, short_temp_dir
from .in_process import InProcessHost
from .isolation import IsolatedPlugins, installed_entry_points, isolated_plugins
from .polling import process_gone, wait_until

__all__ = [
    "AnswerRecorder",
    "CrashCase",
    "CrashPoints",
    "InProcessHost",
    "IsolatedPlugins",
    "WorkflowHome",
    "WorkflowHost",
    "channel_context",
    "channel_effects",
    "claim",
    "host_info",
    "installed_entry_points",
    "isolated_plugins",
    "process_gone",
    "run_record",
    "short_temp_dir",
    "terminal_facts",
    "turn_report",
    "wait_until",
]
