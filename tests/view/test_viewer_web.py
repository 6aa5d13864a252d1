"""`pi-workflows view --web` in a real headless Chromium (Debian's chromium, driven by
Selenium through its chromedriver): the server wants its token, the page shows the runs
list, and a decision answered in the browser continues the run in the host."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from pi_workflows.testing.host import WorkflowHost
from pi_workflows.testing.polling import wait_until
from pi_workflows.view.web import TOKEN_FILE, free_port

from .test_real_run import hold, start_held_continue_lane, use_scripted_agent

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.integration

# Keeps, in page order, the text of everything the app's websocket sends to the page's
# terminal (which draws on a canvas: the DOM holds none of it).
CAPTURE = """
window.__piwScreen = "";
const NativeSocket = window.WebSocket;
window.WebSocket = function (url, protocols) {
  const socket = new NativeSocket(url, protocols);
  const decoder = new TextDecoder();
  socket.addEventListener("message", (event) => {
    window.__piwScreen += typeof event.data === "string"
      ? event.data : decoder.decode(new Uint8Array(event.data), {stream: true});
  });
  return socket;
};
Object.assign(window.WebSocket, NativeSocket);
window.WebSocket.prototype = NativeSocket.prototype;
"""


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except urllib.error.URLError:  # not listening yet
        return 0


def _browser():
    if CHROMIUM is None or CHROMEDRIVER is None:  # a missing part fails, as tmux's does
        pytest.fail(
            "chromium and chromedriver are not on PATH: apt-get install chromium "
            "chromium-driver (.ci/run installs them on a fresh machine)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@dataclass
class Page:
    """The viewer open in Chromium: what its terminal was sent, and a way to press keys."""

    driver: Any
    base: str
    token: str

    def screen(self) -> str:
        return self.driver.execute_script("return window.__piwScreen")

    def shows(self, text: str, what: str, after: str | None = None) -> None:
        """Wait until the page was sent `text` (after the last `after`, if given)."""

        def sent() -> bool:
            screen = self.screen()
            return text in (screen.split(after)[-1] if after else screen)

        wait_until(sent, timeout=60, what=what)

    def keys(self, *keys: str) -> None:
        self.driver.find_element("css selector", ".xterm-helper-textarea").send_keys(*keys)


@contextmanager
def web_server(workflow_host: WorkflowHost) -> Iterator[tuple[str, str]]:
    """`pi-workflows view --web` started as a user starts it: (its base URL, its token);
    its token file is checked and gone when it stops."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", "view", "--web", "--port", str(port)],
        env=workflow_host.env,
        cwd=workflow_host.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its sessions' processes share its process group
    )
    token_path = workflow_host.home.socket_path.parent / TOKEN_FILE
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.fullmatch(
            rf"pi-workflows view: open (http://127\.0\.0\.1:{port}/)\?token=(\S+)\n", line
        )
        assert match, line
        base, token = match.groups()
        assert token_path.read_text() == token + "\n"
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        wait_until(lambda: _status(f"{base}?token={token}") == 200, what="the web viewer")
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)
        # A session's `pi-workflows view` still starting would start a host of its own
        # once the test's host stopped (it did, twice in nine suites at -n 4): none
        # outlives the server.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        wait_until(lambda: not _group_alive(server.pid), what="the viewer's sessions to end")
    assert not token_path.exists()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def web_viewer(workflow_host: WorkflowHost) -> Iterator[Page]:
    """The web viewer open in headless Chromium."""
    with web_server(workflow_host) as (base, token):
        driver = _browser()
        try:
            driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CAPTURE})
            driver.get(f"{base}?token={token}")
            yield Page(driver, base, token)
        finally:
            driver.quit()


def _continuation(workflow_host: WorkflowHost, run_id: str) -> dict:
    client = workflow_host.client()
    try:
        return wait_until(
            lambda: (s := client.known_run_status(run_id))["continuation"] and s,
            timeout=60,
            what="the answer to continue the run",
        )
    finally:
        client.close()


def test_the_web_viewer_wants_its_token_and_answers_a_decision_in_chromium(workflow_host):
    workflow_host.start()
    run_id = workflow_host.start_run("human-decision", {"goal": "ship it"})
    workflow_host.wait_for_status(run_id, "waiting")
    with web_viewer(workflow_host) as page:
        base, token = page.base, page.token
        assert _status(base) == 403
        assert _status(f"{base}?token=not-{token}") == 403
        assert _status(f"{base}static/js/textual.js") == 403
        assert _status(f"{base}ws") == 403

        page.shows(run_id, "the runs list in the page")
        page.keys("\n")  # open the run (the only one)
        page.shows("human decision", "the run view")
        page.keys("a")
        page.shows("Approve the plan", "the answer dialog", after="human decision")
        page.keys("\n")  # its first choice: Continue
        status = _continuation(workflow_host, run_id)
    assert status["continuation"]["runId"].startswith("continuation-")


def test_a_branch_run_is_followed_live_scrubbed_and_answered_in_chromium(workflow_host):
    from selenium.webdriver.common.keys import Keys

    use_scripted_agent(workflow_host, {"classify": {"route": "checkpoint", "reason": "which?"}})
    classify = hold(workflow_host, "classify")
    workflow_host.start()
    run_id = workflow_host.start_run("branch", {"task": "Tidy up the README."})
    with web_viewer(workflow_host) as page:
        page.shows(run_id, "the runs list in the page")
        page.keys("\n")  # open the run (the only one)
        page.shows("1 ◐ classify", "the run view while its decision step runs")
        classify.unlink()  # the step ends while the page is open: the view follows
        page.shows("which?", "the run at its checkpoint")
        page.keys(Keys.LEFT)  # as it was after the decision
        page.shows("steps (step 1 of 2)", "the scrubbed replay")
        page.keys(Keys.END)
        page.shows("steps (live)", "the live view again", after="step 1 of 2")
        page.keys("a")
        page.shows("checkpoint: which?", "the answer dialog")
        page.keys(json.dumps({"readme": "the top-level one"}), "\n")
        status = _continuation(workflow_host, run_id)
    assert status["continuation"]["status"] in ("queued", "running", "completed")
    assert workflow_host.wait_for_run(status["continuation"]["runId"])["status"] == "completed"


def test_a_run_with_two_agent_steps_is_followed_live_and_scrubbed_in_chromium(workflow_host):
    from selenium.webdriver.common.keys import Keys

    run_id, classify, lane = start_held_continue_lane(workflow_host)
    with web_viewer(workflow_host) as page:
        page.shows(run_id, "the runs list in the page")
        page.keys("\n")
        page.shows("steps (live)", "the run view while its first agent step runs")
        page.shows("1 ◐ classify", "the first agent step running")
        classify.unlink()  # the page follows the run from step to step
        page.shows("2 ◐ continue_lane", "the second agent step running")
        page.shows("┗━ continue ━▶ continue_lane", "the lane taken, drawn in the graph")
        lane.unlink()
        page.shows("2 ✓ continue_lane", "the second agent step done")
        page.shows("completed", "the run completed", after="2 ◐ continue_lane")
        page.keys(Keys.LEFT)
        page.shows("steps (step 1 of 2)", "the replay after the first step")
    assert workflow_host.wait_for_run(run_id)["status"] == "completed"
