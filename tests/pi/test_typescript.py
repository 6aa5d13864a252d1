"""The Pi extension's TypeScript is held to the Python code's bar: `tsc --noEmit` (strict),
biome's lint and its unit tests (`node --test` through tsx) all pass in plugins/pi-workflows-pi.

Each check is one npm script of that folder's package.json, so `npm run check` there and this
test run the same commands; a failure shows the tool's own output.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.pi.offline_pi import PI_PACKAGE_DIR

TIMEOUT_SECONDS = 120


@pytest.mark.parametrize("script", ["typecheck", "lint", "test"])
def test_the_pi_extension_passes(script: str) -> None:
    if not (PI_PACKAGE_DIR / "node_modules" / ".bin" / "tsc").exists():
        pytest.fail(
            "The extension's dev tools are not installed: run "
            "`(cd plugins/pi-workflows-pi && npm ci)` (README.md's first command does).",
            pytrace=False,
        )
    npm = shutil.which("npm")
    assert npm, "npm is not on PATH: install Node 20+ with npm"
    done = subprocess.run(
        [npm, "run", "--silent", script],
        cwd=PI_PACKAGE_DIR,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"npm run {script} failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
