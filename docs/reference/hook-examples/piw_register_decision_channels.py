# A channel that writes each decision to a file and reads answers from `<name>.answer` files.
import json
import threading
from pathlib import Path

from pi_workflows.plugin import hookimpl


class FileChannel:
    def __init__(self, context):
        self.context = context
        self.directory = Path(context.options["directory"])
        self.stop = threading.Event()
        threading.Thread(target=self._watch_answers, daemon=True).start()

    def deliver(self, request):
        path = self.directory / f"{request['decisionId']}.json"
        path.write_text(json.dumps(request, indent=2))
        return {"path": str(path)}

    def settle(self, request, resolution, delivery):
        Path(delivery["path"]).unlink(missing_ok=True)
        return None

    def close(self):
        self.stop.set()

    def _watch_answers(self):
        while not self.stop.wait(1.0):
            for answer in self.directory.glob("*.answer"):
                choice, actor = answer.read_text().split()
                decision_id = answer.name.removesuffix(".answer")
                if self.context.settings.allows(actor):
                    self.context.report_answer(decision_id, choice, actor=actor)
                answer.unlink()


@hookimpl
def piw_register_decision_channels(register):
    register("file", FileChannel)
