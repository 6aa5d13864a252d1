"""Decision tests drive a real host (tests.host.conftest) with decision workflows."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.host.conftest import HostHarness, harness, wait_until

__all__ = ["HostHarness", "decision_workflow", "harness", "wait_until", "write_channels"]


def decision_workflow(after_ms: int | None = None) -> str:
    """`decide`: propose → human decision `approve` → one compute node per choice."""
    on_timeout = (
        f'{{"after_ms": {after_ms}, "response": {{"choice": "stop"}}}}' if after_ms else "None"
    )
    return f"""
from pi_workflows import choice, compute, human_decision, switch, text_input, workflow, edge


def request(ctx):
    return {{
        "title": "Ship it?",
        "subject": {{"secret-plan": ctx.input}},
        "presentation": {{
            "summary": "The release is ready.",
            "blocks": [
                {{"type": "section", "title": "Checks"}},
                {{"type": "bullets", "items": ["tests pass", "docs built"]}},
                {{"type": "fields", "items": [{{"label": "version", "value": "1.2.3"}}]}},
            ],
        }},
    }}


WORKFLOW = workflow(
    name="decide",
    start_at="propose",
    nodes={{
        "propose": compute(lambda ctx: {{"plan": "release"}}),
        "approve": human_decision(
            audience="operator",
            choices={{
                "ship": choice("Ship"),
                "stop": choice("Stop"),
                "replan": choice("Replan", input=text_input("why", "What should change?")),
            }},
            request=request,
            on_timeout={on_timeout},
        ),
        "shipped": compute(lambda ctx: {{"route": "ship", "answer": ctx.outputs["approve"]}}),
        "stopped": compute(lambda ctx: {{"route": "stop", "answer": ctx.outputs["approve"]}}),
        "replanned": compute(lambda ctx: {{"route": "replan", "answer": ctx.outputs["approve"]}}),
    }},
    edges=[
        edge("propose", "approve"),
        switch("approve", on="$.choice",
               cases={{"ship": "shipped", "stop": "stopped", "replan": "replanned"}}),
    ],
)
"""


def write_channels(harness: HostHarness, config: dict[str, Any]) -> Path:
    """`<config>/channels.json`, private as the host requires."""
    path = harness.config_dir / "channels.json"
    path.write_text(json.dumps(config))
    os.chmod(path, 0o600)
    return path


def pending_decision(harness: HostHarness, run_id: str) -> dict[str, Any]:
    """Wait for the run's decision to be listed, and return it."""
    client = harness.client()
    try:
        return wait_until(
            lambda: next(
                (d for d in client.list_decisions(include_resolved=True) if d["runId"] == run_id),
                None,
            ),
            what=f"a decision of run {run_id}",
        )
    finally:
        client.close()


def wait_past(deadline_iso: str) -> None:
    """Poll the clock until an ISO deadline has passed."""
    from datetime import datetime

    deadline = datetime.fromisoformat(deadline_iso.replace("Z", "+00:00")).timestamp()
    wait_until(lambda: time.time() > deadline + 0.05, what="the decision deadline")
