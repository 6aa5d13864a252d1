"""Built-in terminal-message presentation: the reference layout of SPEC §10.

The safety wording comes from `pi_workflows.safety_wording`, in the language of the
`terminal_language` setting. `PREAMBLE`, `GUARDRAILS`, `DEFAULT_INSTRUCTIONS` and
`BLOCKED_GUIDANCE` are its English sentences, kept for plugins written against them.
"""

from __future__ import annotations

from ..bounded_values import bounded_terminal_facts
from ..canonical import canonical_json
from ..hookspecs import hookimpl
from ..records import MessageContent, RunRecord, TerminalFacts
from ..safety_wording import SAFETY_SENTENCES, safety_sentences

_ENGLISH = SAFETY_SENTENCES["en"]
DEFAULT_INSTRUCTIONS = _ENGLISH.default_instructions
PREAMBLE = _ENGLISH.preamble
GUARDRAILS = _ENGLISH.guardrails
# A run that completed but reports itself blocked has not done its task (reference 8.7).
BLOCKED_GUIDANCE = _ENGLISH.blocked_guidance


@hookimpl(trylast=True)
def piw_presentation_instructions(run: RunRecord, facts: TerminalFacts) -> str:
    # The workflow's prompt was written for its result; a failure gets the neutral default.
    prompt = run.presentation_prompt
    if facts.get("status") == "completed" and prompt and prompt.strip():
        return prompt.strip()
    return safety_sentences().default_instructions


@hookimpl(trylast=True)
def piw_render_terminal_message(facts: TerminalFacts, instructions: str) -> MessageContent:
    # Large values are quoted cut, with a pointer to `run status` for the whole value.
    quoted_facts = canonical_json(bounded_terminal_facts(facts))
    output = facts.get("finalOutput")
    blocked = facts.get("status") == "completed" and (
        isinstance(output, dict) and output.get("status") == "blocked"
    )
    wording = safety_sentences()
    guidance = [wording.blocked_guidance] if blocked else []
    lines = [
        wording.preamble,
        instructions,
        *guidance,
        *wording.guardrails,
        "",
        wording.result_label,
        quoted_facts,
    ]
    return MessageContent(text="\n".join(lines), details={"terminal": facts})
