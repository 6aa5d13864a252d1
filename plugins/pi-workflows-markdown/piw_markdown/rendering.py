"""The two terminal-message hooks: per-workflow instructions and a Markdown layout.

Both return None while no configuration file exists, so installing the distribution
changes nothing until an operator opts in; the built-in plugin then decides.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pi_workflows.plugin import MessageContent, RunRecord, hookimpl, safety_sentences

from .config import WorkflowSettings, load_config

TRUNCATION_NOTE = "[cut; see 'pi-workflows run status RUN --json' for the full value]"


@hookimpl
def piw_presentation_instructions(run: RunRecord, facts: dict[str, Any]) -> str | None:
    config = load_config()
    if config is None:
        return None
    settings = config.for_workflow(run.workflow_name)
    if facts["status"] == "completed":
        return settings.prompt
    return settings.failure_prompt


@hookimpl
def piw_render_terminal_message(facts: dict[str, Any], instructions: str) -> MessageContent | None:
    config = load_config()
    if config is None:
        return None
    settings = config.for_workflow(facts["workflowName"])
    wording = safety_sentences()  # in the terminal_language setting's language
    lines = [wording.preamble, instructions, *wording.guardrails, ""]
    lines += result_markdown(facts, settings)
    return MessageContent(text="\n".join(lines), details={"format": "markdown"})


def result_markdown(facts: dict[str, Any], settings: WorkflowSettings) -> list[str]:
    """The result section: a heading, the key facts as a list, values in fenced blocks."""
    lines = [
        f"## Workflow result: `{facts['workflowName']}` {facts['status'].replace('_', ' ')}",
        "",
        f"- **Run:** `{facts['runId']}`",
        f"- **Restart:** {facts['restartNumber']} of 3",
    ]
    if facts["reason"]:
        lines.append(f"- **Reason:** {_one_line(facts['reason'])}")
    lines.append(f"- **Fingerprint:** `{facts['terminalFingerprint']}`")
    limit = settings.max_value_chars
    lines += _block("Input", _json(facts["input"]), "json", limit)
    if facts["finalOutput"] is not None:
        lines += _block("Final output", _json(facts["finalOutput"]), "json", limit)
    if facts["error"]:
        lines += _block("Error", facts["error"], "text", limit)
    if facts["earlierOutcomes"]:
        lines += ["", "### Earlier outcomes in this chain", ""]
        for number, outcome in enumerate(facts["earlierOutcomes"], start=1):
            summary = outcome["reason"] or outcome["error"] or "no detail"
            lines.append(
                f"{number}. `{outcome['runId']}` {outcome['status']}: {_one_line(summary)}"
            )
    return lines


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _block(title: str, text: str, language: str, limit: int) -> list[str]:
    if len(text) > limit:
        text = f"{text[:limit]}\n{TRUNCATION_NOTE}"
    # Quoted data may itself contain backticks; the fence must be longer than any run.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return ["", f"### {title}", "", f"{fence}{language}", text, fence]
