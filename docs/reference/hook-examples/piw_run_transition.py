# Append every status change of every run to a JSON-lines file.
import json
import time
from pathlib import Path

from pi_workflows.plugin import hookimpl

JOURNAL = Path("transitions.jsonl")


@hookimpl
def piw_run_transition(run_id, old_status, new_status, detail):
    entry = {"at": time.time(), "run": run_id, "from": old_status, "to": new_status}
    with JOURNAL.open("a") as journal:
        journal.write(json.dumps(entry) + "\n")
