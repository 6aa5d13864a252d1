"""How a run's continuation is named to a person: one phrase for every command that shows it."""

from __future__ import annotations

from typing import Any


def continued_as(carried: dict[str, Any]) -> str:
    """`continued as RUN (STATUS)`, naming the chain's newest run when that is another one."""
    if carried["latestRunId"] == carried["runId"]:
        return f"continued as {carried['runId']} ({carried['status']})"
    return f"continued as {carried['runId']} (now at {carried['latestRunId']}: {carried['status']})"
