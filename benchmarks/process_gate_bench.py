"""What registering a command's process group costs (SPEC §7.4a): prints p50/p95 and ratios.

    python benchmarks/process_gate_bench.py [--runs 200]

Starts `true` and waits for it, three ways, in process:
  1. a plain `subprocess.Popen` in a new session (how shell actions started commands
     before);
  2. `engine.processes.start_registered` with no registry: the `/bin/sh` gate alone;
  3. `start_registered` with a registry that answers at once (the host round trip is
     excluded: through a real host, add one worker-protocol message to register and one
     to unregister).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess

from timing import timed_samples

from pi_workflows.engine.processes import registering_with, start_registered


class _InstantRegistry:
    def register(self, process_group: int, kind: str) -> None:
        return None

    def unregister(self, process_group: int) -> None:
        return None


def _plain() -> None:
    subprocess.Popen(["true"], stdin=subprocess.DEVNULL, start_new_session=True).wait()


def _gated() -> None:
    start_registered(["true"], kind="shell").wait()


def _registered() -> None:
    with registering_with(_InstantRegistry()):
        start_registered(["true"], kind="shell").wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    results = {
        "plain Popen": timed_samples(_plain, runs),
        "gate, no registry": timed_samples(_gated, runs),
        "gate + registry": timed_samples(_registered, runs),
    }
    base = statistics.median(results["plain Popen"])
    for name, samples in results.items():
        p50 = statistics.median(samples)
        p95 = statistics.quantiles(samples, n=20)[-1]
        print(f"{name:18} p50 {p50:6.2f} ms  p95 {p95:6.2f} ms  ratio {p50 / base:4.2f}")


if __name__ == "__main__":
    main()
