"""Numeric settings read from the environment, refused with one clear line when invalid."""

from __future__ import annotations

import os

from .errors import PiWorkflowsError


def positive_number(name: str, default: float) -> float:
    """`$name` as a number > 0, or `default` when unset."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise PiWorkflowsError(f"{name} must be a positive number, got {raw!r}.")
    return value


def positive_int(name: str, default: int) -> int:
    """`$name` as an integer >= 1, or `default` when unset."""
    value = positive_number(name, default)
    if value != int(value):
        raise PiWorkflowsError(f"{name} must be a positive integer, got {os.environ[name]!r}.")
    return int(value)
