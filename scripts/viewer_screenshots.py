"""Screenshots of `pi-workflows view` for docs/viewer.md (SVG, as Textual saves them).

    python scripts/viewer_screenshots.py [--out docs/images]

Runs a private in-process host (the test kit's), starts a few runs of the built-in
examples — one waits at its human decision — and saves the runs list and that run's
view at 100×30, and the run view at 80×24; with `--web`, also the run view served by
`pi-workflows view --web` as headless Chromium shows it (PNG; needs Debian's chromium and
chromium-driver, and selenium).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pi_workflows.testing.host import short_temp_dir
from pi_workflows.testing.in_process import InProcessHost
from pi_workflows.view.app import ViewerApp
from pi_workflows.view.run_screen import RunScreen


async def _settle(pilot: object, ready: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("the viewer did not show the runs in time")
        await pilot.pause(0.05)  # type: ignore[attr-defined]


def shoot(host: InProcessHost, waiting: str, out: Path) -> None:
    client = host.client()

    async def runs_list() -> None:
        app = ViewerApp(client)
        async with app.run_test(size=(100, 30)) as pilot:
            await _settle(pilot, lambda: "3 runs" in str(app.screen.query_one("#title").content))
            app.save_screenshot("viewer-runs.svg", str(out))

    async def run_view(size: tuple[int, int], name: str) -> None:
        app = ViewerApp(client, waiting)
        async with app.run_test(size=size) as pilot:
            await _settle(
                pilot,
                lambda: (
                    isinstance(app.screen, RunScreen)
                    and "⏸ approve" in str(app.screen.query_one("#graph").content)
                ),
            )
            await pilot.press("3")  # the waiting pane: the decision and its choices
            await pilot.pause(0.2)
            app.save_screenshot(name, str(out))

    try:
        asyncio.run(runs_list())
        asyncio.run(run_view((100, 30), "viewer-run.svg"))
        asyncio.run(run_view((80, 24), "viewer-run-80x24.svg"))
    finally:
        client.close()


def shoot_web(host: InProcessHost, out: Path) -> None:
    """The runs list's top run (the waiting one) opened in Chromium, as a PNG."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    server = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", "view", "--web"],
        env=host.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--window-size=1200,760"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split("open ", 1)[1].strip()
        deadline = time.monotonic() + 60
        while True:  # the server may not listen yet, then the page's first bytes
            driver.get(url)
            time.sleep(2)
            if driver.execute_script("return document.body.classList.contains('-first-byte')"):
                break
            if time.monotonic() > deadline:
                raise SystemExit("the web viewer did not draw")
        driver.find_element("css selector", ".xterm-helper-textarea").send_keys("\n")
        time.sleep(3)  # a person's pause: the run view draws
        driver.save_screenshot(str(out / "viewer-web.png"))
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--web", action="store_true", help="also the browser's run view")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    host = InProcessHost(short_temp_dir())
    try:
        host.start()
        for name in ("hello", "echo"):
            host.wait_for_run(host.start_run(name, {"name": "docs"}))
        waiting = host.start_run("human-decision", {"goal": "ship the release"})
        host.wait_for_status(waiting, "waiting")
        shoot(host, waiting, args.out.resolve())
        if args.web:
            shoot_web(host, args.out.resolve())
    finally:
        host.cleanup()
    print(f"saved viewer-runs.svg, viewer-run.svg and viewer-run-80x24.svg in {args.out}")


if __name__ == "__main__":
    main()
