# Log each node attempt as it starts, with its run and workflow.
import logging

from pi_workflows.plugin import hookimpl

log = logging.getLogger("my_plugin")


@hookimpl
def piw_node_attempt_started(attempt):
    log.info(
        "%s/%s: node %s (%s) attempt %d started",
        attempt.workflow_name,
        attempt.run_id,
        attempt.node_id,
        attempt.node_kind,
        attempt.attempt_number,
    )
