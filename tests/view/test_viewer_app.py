"""`pi-workflows view` driven headless by Textual's Pilot against a real host (in-process
tier: its socket, database and workers are real): the runs list follows the host, the run
view draws the graph live, scrubs its steps, and answers, pauses and cancels through the
client with the host's refusals shown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from pi_workflows.testing.host import WorkflowHost
from pi_workflows.testing.polling import wait_until
from pi_workflows.testing.seeding import seed_finished_runs
from pi_workflows.view.app import ViewerApp
from pi_workflows.view.feed import HostFeed
from pi_workflows.view.run_screen import RunScreen

from .test_real_run import hold, use_scripted_agent

DEADLINE_S = 60.0


def shown(app: ViewerApp, selector: str) -> str:
    """The text a Static of the current screen shows ("" while a dialog covers it)."""
    found = app.screen.query(selector)
    return str(found.first(Static).content) if found else ""


async def until(pilot: Pilot, what: str, predicate: Callable[[], bool]) -> None:
    """Let the app run until `predicate()` holds (a deadline, not a sleep)."""
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def drive(
    host: WorkflowHost,
    run_id: str | None,
    script: Callable[[ViewerApp, Pilot], Awaitable[Any]],
    size: tuple[int, int] = (100, 30),
) -> None:
    client = host.client()

    async def main() -> None:
        app = ViewerApp(client, run_id)
        async with app.run_test(size=size) as pilot:
            await script(app, pilot)

    try:
        asyncio.run(main())
    finally:
        client.close()


def test_a_human_decision_is_followed_and_answered_from_the_run_view(in_process_host) -> None:
    in_process_host.start()
    run_id = in_process_host.start_run("human-decision", {"goal": "ship it"})

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(pilot, "the decision waiting", lambda: "⏸ approve" in shown(app, "#graph"))
        assert "✓ proposal" in shown(app, "#graph")
        assert "2 ⏸ approve" in shown(app, "#steps")
        # Never taken for a checkpoint while the read that brings the decision is on its way.
        assert "checkpoint" not in shown(app, "#waiting-text")
        await until(
            pilot,
            "the decision's text",
            lambda: "Approve the plan to ship it?" in shown(app, "#waiting-text"),
        )
        await pilot.press("a")
        await until(pilot, "the answer dialog", lambda: bool(app.screen.query("#choice-replan")))
        await pilot.click("#choice-replan")  # needs its text first: refused in the dialog
        await until(pilot, "the refusal", lambda: "needs text" in shown(app, "#error"))
        await pilot.click("#choice-continue")
        await until(pilot, "the continuation", lambda: "✓ continued" in shown(app, "#graph"))
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.run_id != run_id  # followed it
        graph = shown(app, "#graph")
        assert "┣━ continue ━▶ continued" in graph and "✓ approve  human decision" in graph
        assert "completed" in shown(app, "#title")

    drive(in_process_host, run_id, script)
    status = in_process_host.wait_for_status(run_id, "waiting")  # an answered run stays so
    assert status["continuation"]["status"] == "completed"


def test_a_finished_run_is_scrubbed_step_by_step_and_refuses_a_pause(in_process_host) -> None:
    use_scripted_agent(
        in_process_host,
        {"classify": {"route": "continue", "reason": "clear"}, "continue_lane": {"summary": "ok"}},
    )
    in_process_host.start()
    run_id = in_process_host.start_run("branch", {"task": "Tidy up the README."})
    in_process_host.wait_for_run(run_id)

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(pilot, "the graph", lambda: "✓ continue_lane" in shown(app, "#graph"))
        # The stored snapshot is canonical JSON: cases and nodes in key order.
        assert "┗━ continue ━▶ continue_lane" in shown(app, "#graph")
        assert "steps (live)" in shown(app, "#steps")
        await pilot.press("left")  # as it was after step 1: classify done, nothing taken
        graph = shown(app, "#graph")
        assert "└─ continue ─▶ continue_lane" in graph and "· continue_lane" in graph
        assert "steps (step 1 of 2)" in shown(app, "#steps")
        assert '"route": "continue"' in shown(app, "#step-text")
        await pilot.press("2")  # the transcript pane (the scripted agent keeps none)
        await until(
            pilot,
            "the transcript pane",
            lambda: shown(app, "#transcript-text") == "No agent transcript for this step.",
        )
        await pilot.press("end")
        assert "✓ continue_lane" in shown(app, "#graph")
        await pilot.press("p")  # the host's refusal, as `run pause` shows it
        await until(pilot, "the refusal", lambda: "pause:" in shown(app, "#message"))
        assert shown(app, "#message") == "pause: Run is already terminal"

    drive(in_process_host, run_id, script, size=(80, 24))


def _held_at_classify(host: WorkflowHost) -> tuple[str, Path, dict[str, Any]]:
    """A `branch` run held in its decision step (bound for the checkpoint once the hold
    file goes), and the push that showed that step running."""
    use_scripted_agent(host, {"classify": {"route": "checkpoint", "reason": "which?"}})
    classify = hold(host, "classify")
    host.start()
    run_id = host.start_run("branch", {"task": "Tidy up the README."})
    pushes: list[dict[str, Any]] = []
    feed = HostFeed(
        host.home,
        "view.run.watch",
        lambda _name, payload: pushes.append(payload),
        lambda error: None,
        run_id=run_id,
    ).start()
    try:
        wait_until(
            lambda: any(p["why"]["reason"].startswith("running node classify") for p in pushes),
            what="a push of the decision step running",
        )
    finally:
        feed.stop()
    late = next(p for p in pushes if p["why"]["reason"].startswith("running node classify"))
    return run_id, classify, late


def test_a_push_that_arrives_after_a_newer_read_does_not_take_the_view_back(
    in_process_host,
) -> None:
    """A push and a read travel on two connections: a push sent while the decision step
    ran can arrive after the read that shows the run at its checkpoint."""
    run_id, classify, late = _held_at_classify(in_process_host)
    classify.unlink()

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(
            pilot, "the run at its checkpoint", lambda: "⏸ checkpoint_lane" in shown(app, "#graph")
        )
        screen = app.screen
        assert isinstance(screen, RunScreen)
        screen.run_moved(late)
        await pilot.pause(0.05)
        assert "⏸ checkpoint_lane" in shown(app, "#graph")
        assert "waiting" in shown(app, "#title")
        assert "running node classify" not in shown(app, "#why")

    drive(in_process_host, run_id, script)


def test_the_runs_list_follows_the_host_filters_and_opens_a_run(in_process_host) -> None:
    in_process_host.start()
    first = in_process_host.start_run("hello", {"name": "first"})
    in_process_host.wait_for_run(first)

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        def rows() -> list[str]:
            table = app.screen.query_one(DataTable)
            return [str(table.get_row_at(i)[2]) for i in range(table.row_count)]

        await until(pilot, "the first run", lambda: rows() == [first])
        # Started while the list is open: the host's push adds it on top.
        second = await asyncio.to_thread(in_process_host.start_run, "human-decision", {})
        await until(pilot, "the pushed run", lambda: rows() == [second, first])
        await until(
            pilot,
            "it to wait",
            lambda: "⏸" in str(app.screen.query_one(DataTable).get_row_at(0)[0]),
        )
        await pilot.press("slash")
        await pilot.press(*"completed", "enter")
        await until(pilot, "the filter", lambda: rows() == [first])
        assert "filter: completed" in shown(app, "#title")
        await pilot.press("escape")
        await until(pilot, "all runs again", lambda: rows() == [second, first])
        await pilot.press("enter")  # the top run
        await until(pilot, "its run view", lambda: isinstance(app.screen, RunScreen))
        assert app.screen.run_id == second
        await pilot.press("x")  # cancel, confirmed
        await pilot.press("y")
        await until(pilot, "the cancel", lambda: "cancelled" in shown(app, "#title"))
        await pilot.press("q")
        await until(pilot, "the list", lambda: not isinstance(app.screen, RunScreen))

    closed_lists = []

    async def record_the_list(app: ViewerApp, pilot: Pilot) -> None:
        await script(app, pilot)
        closed_lists.append(app.screen)

    drive(in_process_host, None, record_the_list)
    assert in_process_host.wait_for_run(first)["status"] == "completed"
    # A push that was on its way when the app closed finds the list gone: it is dropped
    # (it raised NoMatches, which a live app shows as a crash).
    [runs_list] = closed_lists
    runs_list.runs_changed([{"runId": first, "status": "completed"}])


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_the_run_view_fits_small_and_wide_terminals(in_process_host, size) -> None:
    in_process_host.start()
    run_id = in_process_host.start_run("human-decision", {})

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(pilot, "the graph", lambda: "⏸ approve" in shown(app, "#graph"))
        graph = app.screen.query_one("#graph-pane")
        assert graph.size.width >= 40 and graph.size.height >= 5

    drive(in_process_host, run_id, script, size=size)


def test_view_of_an_unknown_run_or_without_a_host_is_a_one_line_error(in_process_host) -> None:
    no_host = in_process_host.cli("--no-autostart", "view", check=False)
    assert no_host.returncode == 1 and no_host.stdout == ""
    assert len(no_host.stderr.splitlines()) == 1 and "host" in no_host.stderr

    in_process_host.start()
    unknown = in_process_host.cli("view", "no-such-run", check=False)
    assert unknown.returncode == 1
    assert unknown.stderr == (
        "Error: Workflow run no-such-run does not exist; see 'pi-workflows run list'.\n"
    )


PAY = """
import time
from pathlib import Path

from pi_workflows import action, compute, edge, manual_effect, workflow


def pay(ctx):
    (Path.cwd() / "started").touch()
    deadline = time.monotonic() + 120
    while not (Path.cwd() / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"paid": True}


WORKFLOW = workflow(
    name="pay",
    start_at="pay",
    nodes={
        "pay": action(pay, manual_effect("payment")),
        "receipt": compute(lambda ctx: {"paid": ctx.outputs["pay"]}),
    },
    edges=[edge("pay", "receipt")],
)
"""


def _why(host: WorkflowHost, run_id: str) -> dict[str, Any]:
    client = host.client()
    try:
        return client.why_run(run_id)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("key", "said", "output"),
    [("e", "effect confirm:", {"paid": None}), ("E", "effect retry:", {"paid": {"paid": True}})],
    ids=["confirm", "retry"],
)
def test_an_effect_left_in_doubt_by_a_pause_is_resolved_from_the_run_view(
    in_process_host, key, said, output
):
    in_process_host.write_workflow("pay", PAY)
    in_process_host.start()
    run_id = in_process_host.start_run("pay")
    started = in_process_host.project / "started"

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(pilot, "the action running", started.exists)
        await until(pilot, "the running node", lambda: "◐ pay" in shown(app, "#graph"))
        await pilot.press("p")  # stops the worker in the middle of the payment
        await until(pilot, "the pause", lambda: "durably paused" in shown(app, "#message"))
        await pilot.press("4")  # the effects pane
        await pilot.press("r")  # the next worker finds the payment begun: in doubt
        await until(
            pilot, "the effect in doubt", lambda: "in doubt:" in shown(app, "#effects-text")
        )
        # The `run why` line says what holds the run, as `run why` does.
        why = await asyncio.to_thread(_why, in_process_host, run_id)
        assert why["code"] == "effectAmbiguous", why
        await until(pilot, "the why line", lambda: shown(app, "#why") == f"why: {why['reason']}")
        await pilot.press("r")  # refused as `run resume` is: an operator must say first
        await until(
            pilot,
            "the refusal",
            lambda: shown(app, "#message").startswith("resume: Run waits for an operator:"),
        )
        (in_process_host.project / "go").touch()  # a retried payment completes
        await pilot.press(key)  # confirm: it happened; retry: run the action again
        await until(pilot, "the answer", lambda: said in shown(app, "#message"))
        await until(pilot, "the receipt", lambda: "✓ receipt" in shown(app, "#graph"))
        assert "in doubt:" not in shown(app, "#effects-text")

    drive(in_process_host, run_id, script)
    status = in_process_host.wait_for_run(run_id)
    assert status["status"] == "completed" and status["finalOutput"] == output


def test_the_runs_list_reads_the_next_page_at_its_last_row(in_process_host) -> None:
    # Recent: the host's automatic prune at start takes runs finished long ago.
    seeded = seed_finished_runs(
        in_process_host.home,
        in_process_host.project,
        230,
        first_created_at=int(time.time() * 1000) - 60_000,
    )
    in_process_host.start()

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        def count() -> int:
            return app.screen.query_one(DataTable).row_count

        await until(pilot, "the first page", lambda: count() == 100)
        assert "100+ runs" in shown(app, "#title")
        await pilot.press("ctrl+end")  # the last row: the page after it is read
        await until(pilot, "the second page", lambda: count() == 200)
        await pilot.press("ctrl+end")
        await until(pilot, "the last page", lambda: count() == 230)
        assert "230 runs" in shown(app, "#title")
        table = app.screen.query_one(DataTable)
        rows = [str(table.get_row_at(i)[2]) for i in range(table.row_count)]
        assert rows == seeded[::-1]

    drive(in_process_host, None, script)


def test_no_color_draws_the_run_view_in_monochrome_with_its_glyphs(
    in_process_host, monkeypatch
) -> None:
    from textual.filter import Monochrome, NoColor

    in_process_host.start()
    run_id = in_process_host.start_run("human-decision", {})
    monkeypatch.setenv("NO_COLOR", "1")  # the viewer's environment, not the host's

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        # Every line the app draws goes through Textual's colourless filter, and the
        # statuses still read: the glyphs carry them, not colours.
        assert any(isinstance(f, (Monochrome, NoColor)) for f in app.get_line_filters())
        await until(pilot, "the graph", lambda: "⏸ approve" in shown(app, "#graph"))
        assert "✓ proposal" in shown(app, "#graph")

    drive(in_process_host, run_id, script, size=(80, 24))


# An agent executor that keeps a transcript, as the `pi` executor does.
NARRATING_EXECUTOR = """
from pi_workflows.plugin import hookimpl


class Narrating:
    def run_agent_step(self, request, signal):
        request["transcript"].add("prompt", reason="initial", text="Say hello.\\nBriefly.")
        request["transcript"].add("tool", name="workflow", ok=True)
        return {"output": {"reply": "hello"}}


@hookimpl
def piw_register_agent_executors(register):
    register("narrating", Narrating)
"""

SAY_HELLO = """
from pi_workflows import agent, workflow

WORKFLOW = workflow(name="say-hello", start_at="say", nodes={"say": agent("Say hello.")}, edges=[])
"""


def test_the_transcript_pane_shows_the_agent_steps_transcript(in_process_host) -> None:
    in_process_host.add_plugin("narrating_executor", NARRATING_EXECUTOR)
    in_process_host.env["PI_WORKFLOWS_AGENT_EXECUTOR"] = "narrating"
    in_process_host.write_workflow("say-hello", SAY_HELLO)
    in_process_host.start()
    run_id = in_process_host.start_run("say-hello")
    assert in_process_host.wait_for_run(run_id)["status"] == "completed"

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(pilot, "the graph", lambda: "✓ say" in shown(app, "#graph"))
        await pilot.press("2")
        await until(pilot, "the transcript", lambda: "prompt" in shown(app, "#transcript-text"))
        lines = shown(app, "#transcript-text").splitlines()
        assert lines[0].endswith(" prompt reason=initial"), lines
        assert lines[1:3] == ["    Say hello.", "    Briefly."]
        assert lines[3].endswith(" tool name=workflow ok=true"), lines
        assert all(line[2] == ":" and line[8] == "." for line in (lines[0], lines[3]))

    drive(in_process_host, run_id, script)


def test_a_view_drawn_from_a_push_refuses_an_older_push_before_its_read(
    in_process_host, monkeypatch
) -> None:
    """A push the view draws at once (its read follows) moves the view to that push's
    revision: an older push arriving before that read is not drawn over it."""
    run_id, classify, late = _held_at_classify(in_process_host)

    async def script(app: ViewerApp, pilot: Pilot) -> None:
        await until(
            pilot,
            "the decision step running",
            lambda: "running node classify" in shown(app, "#why"),
        )
        screen = app.screen
        assert isinstance(screen, RunScreen)

        async def read_held_back() -> None:
            """The read a push asks for, still on its way."""

        monkeypatch.setattr(screen, "refresh_run", read_held_back)
        classify.unlink()
        await until(
            pilot,
            "the checkpoint, drawn from its push",
            lambda: "⏸ checkpoint_lane" in shown(app, "#graph"),
        )
        screen.run_moved(late)
        await pilot.pause(0.05)
        assert "⏸ checkpoint_lane" in shown(app, "#graph")
        assert "running node classify" not in shown(app, "#why")

    drive(in_process_host, run_id, script)
