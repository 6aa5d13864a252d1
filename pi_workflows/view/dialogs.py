"""The viewer's dialogs: confirming a cancel, and answering a decision or a checkpoint.

A dialog only collects the answer; the run view sends it through the client and shows
the host's refusal, if any, in the dialog's error line (the dialog stays open).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static


class ConfirmDialog(ModalScreen[bool]):
    """A yes/no question; dismissed with True only for yes."""

    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class AnswerDialog(ModalScreen[None]):
    """Answer a pending decision (its choices as buttons, text where a choice asks for it)
    or a checkpoint (JSON, or plain text sent as a string).

    `send(answer)` is called (in a thread: it waits for the host) with `{"choice",
    "input"?}` for a decision or `{"input"}` for a checkpoint; it returns None when the
    host accepted the answer, else the refusal to show.
    """

    BINDINGS = [Binding("escape", "dismiss_dialog", "close")]

    def __init__(self, title: str, decision: dict[str, Any] | None, send: Any) -> None:
        super().__init__()
        self.title_text = title
        self.decision = decision
        self.send = send

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, id="question")
            if self.decision is not None:
                asks_text = [c for c in self.decision["choices"].values() if c.get("input")]
                if asks_text:
                    prompt = " / ".join(c["input"]["prompt"] for c in asks_text)
                    yield Input(placeholder=prompt, id="text")
                with Horizontal(classes="buttons"):
                    for key, choice in self.decision["choices"].items():
                        yield Button(choice["label"], id=f"choice-{key}", name=key)
            else:
                yield Input(
                    placeholder='the answer: JSON such as {"approved": true}, or text', id="text"
                )
                with Horizontal(classes="buttons"):
                    yield Button("Answer", id="answer", variant="primary")
            yield Static("", id="error")

    def on_mount(self) -> None:
        # A decision's first choice takes enter; a checkpoint's answer is typed first.
        first = self.query(Button).first() if self.decision is not None else self.query_one(Input)
        first.focus()

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        text = self.query_one("#text", Input).value if self.query("#text") else ""
        if self.decision is None:
            await self._submit({"input": _checkpoint_value(text)})
            return
        key = event.button.name or ""
        choice = self.decision["choices"][key]
        answer: dict[str, Any] = {"choice": key}
        if choice.get("input"):
            if not text.strip():
                self._error(f"{choice['label']} needs text: {choice['input']['prompt']}")
                return
            answer["input"] = text
        await self._submit(answer)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        if self.decision is None:
            await self._submit({"input": _checkpoint_value(event.value)})

    async def _submit(self, answer: dict[str, Any]) -> None:
        self._error("sending…")
        refusal = await asyncio.to_thread(self.send, answer)
        if not self.is_attached:  # closed while the host answered
            return
        if refusal is None:
            self.dismiss(None)
        else:
            self._error(refusal)

    def _error(self, text: str) -> None:
        self.query_one("#error", Static).update(text)

    def action_dismiss_dialog(self) -> None:
        self.dismiss(None)


def _checkpoint_value(text: str) -> Any:
    """What typed text answers: its JSON value when it is JSON, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text
