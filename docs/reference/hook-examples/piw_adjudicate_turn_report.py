# Log every turn report, then let the built-in rules adjudicate it.
import logging

from pi_workflows.plugin import hookimpl

log = logging.getLogger("my_plugin.turns")


@hookimpl(tryfirst=True)
def piw_adjudicate_turn_report(report, ctx):
    log.info("turn %s of run %s: %s", report.workflow_turn_id, report.run_id, report.state)
    return None
