"""What a plugin's notification thread pays per `state_view()` call (issue 27).

    python benchmarks/state_view_bench.py [--queued 200] [--calls 500] [--postgres URL]

In process, on a real SQLite state file (or an empty PostgreSQL database named by
`--postgres`): queues N `hello` runs, then times `state_view().queue_depth()` and
`state_view().run(id)` on one thread that is not the store's, as a plugin's
notification thread calls them. Prints median and p95 in ms of

- `kept`: the view as it is, which keeps the thread's connection for its next calls;
- `per call`: the same calls with the thread's connection closed after each one, so
  each call opens a connection again — what the view did before it kept one.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_bench import percentile, queue_runs  # noqa: E402
from timing import timed_samples  # noqa: E402

from pi_workflows.home import Home  # noqa: E402
from pi_workflows.plugin import state_view  # noqa: E402
from pi_workflows.storage import open_state  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=200)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--postgres", metavar="URL", default=None)
    options = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="piw-view-bench-"))
    store = open_state(Home(scratch / "home"), options.postgres)
    try:
        with store.transaction():
            queue_runs(options.queued, scratch)

        def kept() -> None:
            view = state_view()
            view.queue_depth()
            view.run("run-000000")

        def per_call() -> None:
            kept()
            store.db.close()  # this thread's connection: the next call opens one again

        backend = "PostgreSQL" if options.postgres else "SQLite"
        print(
            f"{backend}, {options.queued} queued runs, {options.calls} calls of "
            "queue_depth() + run(id) on one plugin thread"
        )
        with ThreadPoolExecutor(max_workers=1) as thread:
            for name, action in (("per call", per_call), ("kept", kept)):
                samples = thread.submit(timed_samples, action, options.calls).result()
                print(
                    f"  {name:9} median {statistics.median(samples):6.3f} ms   "
                    f"p95 {percentile(samples, 0.95):6.3f} ms"
                )
    finally:
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
