# Count node attempts by workflow, node and outcome, and keep their durations.
import collections

from pi_workflows.plugin import hookimpl

OUTCOMES = collections.Counter()
DURATIONS_MS = collections.defaultdict(list)


@hookimpl
def piw_node_attempt_finished(attempt):
    key = (attempt.workflow_name, attempt.node_id, attempt.outcome)
    OUTCOMES[key] += 1
    DURATIONS_MS[key].append(attempt.finished_at - attempt.started_at)
    if attempt.error_class is not None:
        OUTCOMES[(attempt.workflow_name, attempt.node_id, attempt.error_class)] += 1
