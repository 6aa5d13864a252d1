"""`pi-workflows view --web` in a real headless Chromium (Debian's chromium, driven by
Selenium through its chromedriver): the server wants its token, the page shows the runs
list, and a decision answered in the browser continues the run in the host."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from pi_workflows.testing.polling import wait_until
from pi_workflows.view.web import TOKEN_FILE, free_port

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


def test_the_web_viewer_wants_its_token_and_answers_a_decision_in_chromium(workflow_host):
    workflow_host.start()
    run_id = workflow_host.start_run("human-decision", {"goal": "ship it"})
    workflow_host.wait_for_status(run_id, "waiting")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", "view", "--web", "--port", str(port)],
        env=workflow_host.env,
        cwd=workflow_host.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    driver = None
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.fullmatch(
            rf"pi-workflows view: open (http://127\.0\.0\.1:{port}/)\?token=(\S+)\n", line
        )
        assert match, line
        base, token = match.groups()
        token_path = workflow_host.home.socket_path.parent / TOKEN_FILE
        assert token_path.read_text() == token + "\n"
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        wait_until(lambda: _status(f"{base}?token={token}") == 200, what="the web viewer")
        assert _status(base) == 403
        assert _status(f"{base}?token=not-{token}") == 403
        assert _status(f"{base}static/js/textual.js") == 403
        assert _status(f"{base}ws") == 403

        driver = _browser()
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CAPTURE})
        driver.get(f"{base}?token={token}")

        def screen() -> str:
            return driver.execute_script("return window.__piwScreen")

        wait_until(lambda: run_id in screen(), timeout=60, what="the runs list in the page")
        keys = driver.find_element("css selector", ".xterm-helper-textarea")
        keys.send_keys("\n")  # open the run (the only one)
        wait_until(lambda: "human decision" in screen(), timeout=60, what="the run view")
        keys.send_keys("a")
        wait_until(
            lambda: "Approve the plan" in screen().split("human decision")[-1],
            timeout=60,
            what="the answer dialog",
        )
        keys.send_keys("\n")  # its first choice: Continue

        client = workflow_host.client()
        try:
            status = wait_until(
                lambda: (s := client.known_run_status(run_id))["continuation"] and s,
                timeout=60,
                what="the answer to continue the run",
            )
        finally:
            client.close()
        assert status["continuation"]["runId"].startswith("continuation-")
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=30)
    assert not (workflow_host.home.socket_path.parent / TOKEN_FILE).exists()
