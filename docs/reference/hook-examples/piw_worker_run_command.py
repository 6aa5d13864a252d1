# Refuse to start runs whose input is not a JSON object (the launch fails with this sentence).
from pi_workflows.plugin import hookimpl


@hookimpl(tryfirst=True)
def piw_worker_run_command(record, resume_interaction_attempt_id):
    if not record.is_initialized and not isinstance(record.input, dict):
        raise ValueError(f"Workflow run {record.run_id} needs a JSON object as input")
    return None  # the built-in decides start/resume/restart/continue
