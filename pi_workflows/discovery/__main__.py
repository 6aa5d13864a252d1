"""The resolver process: `python -m pi_workflows.discovery resolve NAME|list --project DIR`.

Prints one JSON value on stdout. Workflow files are imported here, never in the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..parent_death import die_with_parent
from . import PARENT_PID_ENV, describe_all, describe_one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pi_workflows.discovery")
    commands = parser.add_subparsers(dest="command", required=True)
    resolve = commands.add_parser("resolve", help="resolve one workflow by name")
    resolve.add_argument("name")
    resolve.add_argument("--project", default=".")
    listing = commands.add_parser("list", help="list every workflow")
    listing.add_argument("--project", default=".")
    arguments = parser.parse_args(argv)
    if os.environ.get(PARENT_PID_ENV):
        die_with_parent(int(os.environ[PARENT_PID_ENV]))
    project = Path(arguments.project).resolve()
    answer: dict[str, Any] | list[dict[str, Any]]
    if arguments.command == "resolve":
        answer = describe_one(arguments.name, project)
    else:
        answer = describe_all(project)
    json.dump(answer, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
