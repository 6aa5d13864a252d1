"""Prune steps beside kept runs that each have an agent transcript (issue 26).

    python benchmarks/nested_prune_bench.py [--kept 10000] [--expired 500]

Seeds a private home (no host) with KEPT recent finished runs and EXPIRED ones that
finished 40 days ago, each with one agent transcript, then prunes as `state prune --apply`
does (`prune_batches`) and times each step of 50 lineages. A transcript is named only
inside its event's payload: before schema 5 a step proved the expired runs' transcripts
unreferenced by reading every transcript event's payload the database held; since, it
looks their holders up in `nested_blobs`. Runs on either (the same calls exist in both).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

from host_bench import percentile
from private_host import private_home

from pi_workflows.clock import now_ms
from pi_workflows.storage import open_state
from pi_workflows.storage.models import Run
from pi_workflows.storage.retention import DAY_MS, PruneReport, prune_batches
from pi_workflows.storage.run_state import record_transcript
from pi_workflows.testing.seeding import seed_finished_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, default=10_000)
    parser.add_argument("--expired", type=int, default=500)
    args = parser.parse_args()

    root, home, project, _ = private_home("piw-nested-")
    try:
        total = args.kept + args.expired
        run_ids = seed_finished_runs(home, project, total, first_created_at=now_ms())
        store = open_state(home)
        try:
            with store.transaction():
                for run_id in run_ids:
                    entries = [{"kind": "text", "text": f"what the agent said in {run_id}"}]
                    record_transcript(
                        run_id, {"nodeId": "agent", "attemptId": f"{run_id}-1", "entries": entries}
                    )
                old = now_ms() - 40 * DAY_MS
                expired = run_ids[: args.expired]
                Run.update(finished_at=old).where(Run.run_id.in_(expired)).execute()
            print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            report = PruneReport(before=now_ms() - 30 * DAY_MS, applied=True)
            samples = []
            steps = prune_batches(store, report)
            while True:
                began = time.perf_counter()
                if next(steps, StopIteration) is StopIteration:
                    break
                samples.append((time.perf_counter() - began) * 1000)
        finally:
            store.close()
        lineage_steps = samples[: -(-args.expired // 50)]
        print(
            f"pruned {report.runs} runs, {report.transcripts} transcripts, {report.blobs} "
            f"blobs beside {args.kept} kept runs with a transcript each: the plan and first "
            f"step {lineage_steps[0]:.0f} ms, then a step of 50 lineages p50 "
            f"{percentile(lineage_steps[1:] or lineage_steps, 0.5):.0f} ms, max "
            f"{max(lineage_steps):.0f} ms"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
