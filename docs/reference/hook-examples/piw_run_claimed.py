# Count claims per workflow, e.g. to export as metrics.
from collections import Counter

from pi_workflows.plugin import hookimpl

claims_by_workflow: Counter[str] = Counter()


@hookimpl
def piw_run_claimed(run, claim):
    claims_by_workflow[run.workflow_name] += 1
