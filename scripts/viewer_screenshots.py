"""Screenshots of `pi-workflows view` for docs/viewer.md (SVG, as Textual saves them).

    python scripts/viewer_screenshots.py [--out docs/images]

Runs a private in-process host (the test kit's), starts a few runs of the built-in
examples — one waits at its human decision — and saves the runs list and that run's
view at 100×30, and the run view at 80×24.
"""

from __future__ import annotations

import argparse
import asyncio
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
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
    finally:
        host.cleanup()
    print(f"saved viewer-runs.svg, viewer-run.svg and viewer-run-80x24.svg in {args.out}")


if __name__ == "__main__":
    main()
