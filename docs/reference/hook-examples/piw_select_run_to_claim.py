# Claim runs of `urgent-*` workflows before anything else; otherwise let the built-in pick.
from pi_workflows.plugin import hookimpl


@hookimpl
def piw_select_run_to_claim(candidates, host):
    urgent = [run for run in candidates if run.workflow_name.startswith("urgent-")]
    return min(urgent, key=lambda run: run.created_at) if urgent else None
