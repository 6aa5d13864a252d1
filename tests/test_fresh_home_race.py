"""Many first commands at once on a fresh home: one creates the schema, none crashes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pi_workflows.testing import WorkflowHome


@pytest.mark.scenario("2.19")
def test_concurrent_first_commands_on_a_fresh_home_all_succeed(home_env: WorkflowHome):
    for trial in range(3):
        home = home_env.root / f"fresh-{trial}"
        commands = [
            subprocess.Popen(
                [sys.executable, "-m", "pi_workflows", "--home", str(home), "state", "status"],
                env=home_env.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        results = [(c.wait(timeout=120), c.stderr.read()) for c in commands]
        for c in commands:
            c.stdout.close()
            c.stderr.close()
        assert [code for code, _ in results] == [0] * 8, [err for _, err in results]
