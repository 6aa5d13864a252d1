"""Many first openings at once of a fresh home: one creates the schema, none crashes.

The processes open the state as a host does (`open_state`, read-write): the read-only
state commands create nothing.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from pi_workflows.storage import SCHEMA_NAME, SCHEMA_VERSION
from pi_workflows.testing import WorkflowHome

OPEN_STATE = """
import sys
from pathlib import Path

from pi_workflows.home import Home
from pi_workflows.storage import open_state

open_state(Home(Path(sys.argv[1]))).close()
"""


@pytest.mark.scenario("2.19")
def test_concurrent_first_openings_of_a_fresh_home_all_succeed(home_env: WorkflowHome):
    for trial in range(3):
        home = home_env.root / f"fresh-{trial}"
        commands = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_STATE, str(home)],
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
        # The database they raced to create is whole: one schema, created once.
        connection = sqlite3.connect(home / "state.sqlite")
        try:
            assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert connection.execute(
                "SELECT schema_name, schema_version FROM schema_meta"
            ).fetchall() == [(SCHEMA_NAME, SCHEMA_VERSION)]
        finally:
            connection.close()
        verified = home_env.run_cli("--home", str(home), "state", "verify")
        assert verified.returncode == 0, verified.stderr
