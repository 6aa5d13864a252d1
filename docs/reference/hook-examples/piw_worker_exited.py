# Count worker crashes per workflow, and keep the signals that ended them.
import collections

from pi_workflows.plugin import hookimpl, state_view

CRASHES = collections.Counter()
SIGNALS = collections.Counter()


@hookimpl
def piw_worker_exited(run_id, outcome, exit_code, signal, at):
    if outcome != "crashed":
        return
    run = state_view().run(run_id)
    CRASHES[run.workflow_name if run else "?"] += 1
    if signal is not None:
        SIGNALS[signal] += 1
