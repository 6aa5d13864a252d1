# At most one headless run at a time on this host; interactive runs are not limited.
from pi_workflows.plugin import hookimpl

running_headless: set[str] = set()


@hookimpl
def piw_may_claim(run, host):
    if run.execution_mode == "headless" and running_headless - {run.run_id}:
        return False
    return None


@hookimpl
def piw_run_claimed(run, claim):
    if run.execution_mode == "headless":
        running_headless.add(run.run_id)


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail):
    if new_status in ("completed", "failed", "timed_out", "cancelled", "waiting"):
        running_headless.discard(run_id)
