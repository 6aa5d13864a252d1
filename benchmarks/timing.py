"""Timing helpers the in-process benchmark scripts share (run them as scripts)."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed_samples(action: Callable[[], object], runs: int) -> list[float]:
    """Milliseconds of `runs` calls of `action`, after one untimed warm-up call."""
    action()
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        action()
        samples.append((time.perf_counter() - began) * 1000)
    return samples
