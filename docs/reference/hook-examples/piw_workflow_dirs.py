# Also look for workflows in the team's shared directory next to the project.
from pi_workflows.plugin import hookimpl


@hookimpl
def piw_workflow_dirs(project):
    return [project.parent / "team-workflows"]
