"""JSON values from `--input-json TEXT` or `--input-file PATH` (`-` for stdin).

A file keeps large or secret inputs off the command line (its length limit, and `ps`,
where every local user can read it). Either way the value is checked against the
limits of `pi_workflows.limits` before anything is sent.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..errors import InvalidInputError
from ..limits import MAX_INPUT_BYTES, MAX_JSON_DEPTH, checked_json
from ..strict_json import UNIQUE_KEYS_DECODER, DuplicateKeyError, NotJsonConstantError

NOTHING = object()  # neither option given


def input_options(command: Any) -> Any:
    """Add `--input-json` and `--input-file` to a click command."""
    command = click.option(
        "--input-file",
        default=None,
        help="Read the JSON value from PATH ('-' for stdin); keeps it out of 'ps'.",
    )(command)
    return click.option("--input-json", default=None, help="The JSON value itself.")(command)


def read_json_input(input_json: str | None, input_file: str | None, what: str) -> Any:
    """The checked value of whichever option was given, or NOTHING."""
    if input_json is not None and input_file is not None:
        raise click.UsageError("Give --input-json or --input-file, not both.")
    if input_json is not None:
        text, source = input_json, "--input-json"
    elif input_file is not None:
        text, source = _read_file(input_file), f"--input-file {input_file}"
    else:
        return NOTHING
    value = parse_json_text(text, source)
    checked_json(value, what, MAX_INPUT_BYTES)
    return value


def _read_file(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise InvalidInputError(f"Cannot read --input-file {path}: {error.strerror}.") from None
    except UnicodeDecodeError:
        raise InvalidInputError(f"--input-file {path} is not UTF-8 text.") from None


def parse_json_text(text: str, source: str) -> Any:
    """`text` as one JSON value; a one-line `InvalidInputError` naming `source` otherwise."""
    try:
        return UNIQUE_KEYS_DECODER.decode(text)
    except json.JSONDecodeError as error:
        raise InvalidInputError(
            f"{source} is not valid JSON ({error.msg} at position {error.pos}); "
            'quote the whole value, e.g. \'{"name": "Ada"}\'.'
        ) from None
    except DuplicateKeyError as error:
        raise InvalidInputError(
            f"{source} gives the key {error.key[:40]!r} twice in one object; keep one of them."
        ) from None
    except NotJsonConstantError:
        raise InvalidInputError(
            f"{source} contains NaN or Infinity, which JSON does not allow; use null or a string."
        ) from None
    except RecursionError:
        raise InvalidInputError(
            f"{source} is nested more than {MAX_JSON_DEPTH} levels deep; flatten it."
        ) from None
