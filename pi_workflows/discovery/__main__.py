"""The resolver process: `python -m pi_workflows.discovery resolve NAME|list --project DIR`.

Prints one JSON value on stdout. Workflow files are imported here, never in the host.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import discover, find


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pi_workflows.discovery")
    commands = parser.add_subparsers(dest="command", required=True)
    resolve = commands.add_parser("resolve", help="resolve one workflow by name")
    resolve.add_argument("name")
    resolve.add_argument("--project", default=".")
    listing = commands.add_parser("list", help="list every workflow")
    listing.add_argument("--project", default=".")
    arguments = parser.parse_args(argv)
    project = Path(arguments.project).resolve()
    if arguments.command == "resolve":
        answer = find(arguments.name, project).describe()
    else:
        answer = [entry.describe() for entry in discover(project)]
    json.dump(answer, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
