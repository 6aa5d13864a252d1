# Give review steps more patience; let the built-in decide everything else.
from pi_workflows.plugin import hookimpl


@hookimpl
def piw_unproductive_turn_limit(run, node_id):
    return 5 if node_id == "review" else None
