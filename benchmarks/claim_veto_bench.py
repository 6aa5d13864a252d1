"""Claim-pass cost when a plugin vetoes every queued run (issue 22.9).

    python benchmarks/claim_veto_bench.py [--queued 500 1000 3000] [--passes 20]

In process, on a real SQLite state file: queues N `hello` runs, registers a
`piw_may_claim` plugin that vetoes every run, and times claim passes of the host's claim
gate (`WorkerSlots.claim_free_slots`, outside any transaction, as the poll and
after-commit passes run it) on an asyncio loop. Prints median and p95 in ms of

- first pass: nothing remembered, every run is asked (a host's first pass); the gate
  reads a long queue a page at a time, each page from where the last one stopped, and
  asks one page per loop turn: `total` is the whole pass, `turn` its longest turn (how
  long the loop is blocked at most);
- next passes: the vetoes are remembered (the passes after each commit): the pages are
  read, several per turn, and nobody is asked;
- `cpu`: the CPU time the loop's thread spent in a pass (the hook calls run on a helper
  thread), which a loaded machine inflates much less than the wall-clock figures.

(The figures of the code before the gate, `Host.claim_free_slots` asking again on every
pass in one turn, are in docs/performance.md; this script no longer runs that code.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_bench import percentile, queue_runs  # noqa: E402

from pi_workflows import hookimpl, plugins  # noqa: E402
from pi_workflows.home import Home  # noqa: E402
from pi_workflows.storage import open_state  # noqa: E402


class VetoAll:
    @hookimpl
    def piw_may_claim(self, run, host):  # noqa: ANN001, ANN201 (a hook implementation)
        return False


def pass_runner(store):  # noqa: ANN001, ANN201
    """(one claim pass, forget what passes remember, is a pass still scheduled)."""
    from pi_workflows.hook_deadline import DeadlineRunner
    from pi_workflows.host.slots import WorkerSlots

    state: dict = {}

    def fresh() -> None:
        slots = WorkerSlots(
            "bench-host",
            max_workers=4,
            claim_window=64,
            run_lease_ms=30_000,
            hooks=DeadlineRunner(1.0),
        )
        slots.open(store, 1, launcher=None)  # type: ignore[arg-type]  (nothing is claimed)
        state["slots"] = slots

    fresh()
    return (
        lambda: state["slots"].claim_free_slots(),
        fresh,
        lambda: state["slots"]._scheduled,  # the pass goes on in the next loop turn
    )


async def timed_pass(claim_pass, goes_on) -> tuple[float, float, float]:  # noqa: ANN001
    """(ms of the whole pass, ms of its longest loop turn, CPU ms of the loop's thread)."""
    cpu = time.thread_time()
    began = time.perf_counter()
    claim_pass()
    longest = time.perf_counter() - began
    while goes_on():
        turn = time.perf_counter()
        await asyncio.sleep(0)  # the scheduled rest of the pass runs in this turn
        longest = max(longest, time.perf_counter() - turn)
    elapsed = time.perf_counter() - began
    return elapsed * 1000, longest * 1000, (time.thread_time() - cpu) * 1000


async def bench(queued: int, passes: int) -> dict[str, list[float]]:
    root = Path(tempfile.mkdtemp(prefix="piw-veto-"))
    os.chmod(root, 0o700)
    home = Home(root)
    store = open_state(home)
    figures: dict[str, list[float]] = {
        "total": [],
        "turn": [],
        "cpu": [],
        "next": [],
        "next cpu": [],
    }
    try:
        with store.transaction():
            queue_runs(queued, root)
        with plugins.temporary_plugin(VetoAll(), "veto_all"):
            claim_pass, forget, goes_on = pass_runner(store)
            for _ in range(passes):
                forget()
                total, turn, cpu = await timed_pass(claim_pass, goes_on)
                figures["total"].append(total)
                figures["turn"].append(turn)
                figures["cpu"].append(cpu)
                total, _, cpu = await timed_pass(claim_pass, goes_on)
                figures["next"].append(total)
                figures["next cpu"].append(cpu)
        return figures
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):7.1f} p95 {percentile(values, 0.95):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, nargs="+", default=[500, 1000, 3000])
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    for queued in args.queued:
        figures = asyncio.run(bench(queued, args.passes))
        print(
            f"{queued:>5} vetoed runs (ms): first pass total {summary(figures['total'])}, "
            f"longest turn {summary(figures['turn'])}, cpu {summary(figures['cpu'])}; "
            f"next passes {summary(figures['next'])}, cpu {summary(figures['next cpu'])}"
        )


if __name__ == "__main__":
    main()
