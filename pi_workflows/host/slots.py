"""Worker slots: the host's runs, their claims and its capacity, and the one claim gate.

`WorkerSlots` alone owns which runs this host supervises (`active_runs`), which claims
wait for their commit to launch (`pending_claims`), which runs wait for an operator
(`blocked_runs`) and the worker limit (``PI_WORKFLOWS_MAX_WORKERS``). Every path that
starts a worker — the claim pass after a start, a freed slot or a poll; `run resume`; a
submission to validate or an expired step deadline; a continuation — goes through its
gate, in this order (SPEC §6):

1. capacity: a free worker slot, or no claim;
2. the claim hooks (`piw_select_run_to_claim`, `piw_may_claim`), asked outside any
   transaction, over a whole candidate window at once, under the hook deadline
   (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``); a plugin that raises or hangs is left out and
   named (`failures`), and claiming goes on without it;
3. the fenced claim: compare-and-set on the claim generation, in a transaction that
   also records the worker (on PostgreSQL the claim row is locked `SKIP LOCKED` first,
   so hosts claiming at once take different runs);
4. the launch, after that transaction commits.

While only the built-in selection answers and no plugin vetoes, step 2 asks nobody: the
pass then claims inside the transaction of the write that made a run claimable or freed
a slot (one commit, no wait for the next pass). With claim plugins, a pass inside a
transaction is deferred to just after its commit.

A veto is remembered until the run changes (its revision) or the host's worker count
changes (the hooks see it); each poll asks again the vetoes remembered longest, a chunk
at a time. A pass reads the candidates in claim order a page at a time, each page from
where the last one stopped, and asks the hooks about the fresh runs of a page in one
turn of the event loop: a queue of vetoed runs is read once per pass and asked once, and
no turn grows with it. A pass asked for while one is in progress follows it, from the
first candidate, so a run freed or changed behind the pass's place is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from .. import plugins
from ..errors import PiWorkflowsError
from ..event_types import EventType
from ..hook_deadline import DeadlineRunner
from ..records import Claim, HostInfo, RunRecord, WorkerLaunchEnvelope
from ..storage import StateStore, run_claims
from ..storage.run_poison import ProgressMark
from ..storage.runs import run_record, run_records
from .active_run import ActiveRun

log = logging.getLogger("pi_workflows.host")

# The most candidates one turn of the event loop asks the claim hooks about (a page of
# candidates): a long queue of vetoed runs is asked in pages, the pass going on in the
# next turn, so no turn stalls the loop for long; the poll asks again this many of the
# vetoes remembered longest.
ASK_PER_TURN = 256
# The most candidates one turn reads: remembered vetoes are skipped without asking
# anyone, so after a page of them the turn reads on, in one larger page (the passes
# after commits read a few thousand remembered vetoes in one turn of a few ms).
READ_PER_TURN = 16 * ASK_PER_TURN


@dataclass(frozen=True)
class PreparedWorker:
    """A worker recorded with its run's claim, launched once that commits."""

    worker_epoch: str
    envelope: WorkerLaunchEnvelope
    progress: ProgressMark
    # The run as read once its claim committed, when the launch read it (worker.ready's
    # answer prepared at launch starts from it instead of reading it again).
    claimed: RunRecord | None = None


class WorkerLauncher(Protocol):
    """What the gate needs of the host to start a worker."""

    def record_worker(self, run_id: str, claim: Claim) -> PreparedWorker:
        """The worker row and launch envelope, in the claim's transaction."""

    def launch(self, run_id: str, token: str, claim: Claim, worker: PreparedWorker) -> None:
        """After the claim committed: start the worker's supervision."""

    def drop_unlaunched(self, run_id: str) -> None:
        """Before a claim's worker row: drop this host's row of an earlier claim whose
        commit's outcome it never learnt, so its worker never launched."""


@dataclass(frozen=True)
class GateAnswer:
    """A targeted claim's outcome: the generation, or why there is none."""

    generation: int | None
    # "full": no free worker slot; "ask": claim plugins must be asked outside this
    # transaction first; "vetoed": a plugin refused; "taken": the claim could not be had.
    refusal: str | None = None


class WorkerSlots:
    def __init__(
        self,
        host_id: str,
        *,
        max_workers: int,
        claim_window: int,
        run_lease_ms: int,
        hooks: DeadlineRunner,
    ) -> None:
        self.host_id = host_id
        self.max_workers = max_workers
        self.claim_window = claim_window
        self.run_lease_ms = run_lease_ms
        self.hooks = hooks
        self.active_runs: dict[str, ActiveRun] = {}
        self.pending_claims: dict[str, str] = {}  # run id -> claim token of a pending start
        self.blocked_runs: set[str] = set()
        # Sentences naming the claim plugins that failed or hang, shown by `host status`
        # and `run why` until a pass gets an answer from them again.
        self.failures: list[str] = []
        self.store: StateStore | None = None
        self.epoch = 0
        self._launcher: WorkerLauncher | None = None
        self._open = False
        self._scheduled = False
        # The pass in progress: where its next turn goes on reading (None: no pass in
        # progress), and whether a pass from the first candidate was asked for meanwhile.
        self._place: run_claims.ClaimPlace | None = None
        self._pass_again = False
        # Vetoed runs: run id -> the revision the veto was given for.
        self._vetoes: dict[str, int] = {}
        self._vetoes_at_load = 0  # the worker count the remembered vetoes were given at

    # --- life --------------------------------------------------------------------------

    def open(self, store: StateStore, epoch: int, launcher: WorkerLauncher) -> None:
        """The host holds its epoch: claims may be taken."""
        self.store, self.epoch, self._launcher = store, epoch, launcher
        self._open = True

    def close(self) -> None:
        """The host is stopping: no claim from now on."""
        self._open = False

    @property
    def is_closed(self) -> bool:
        """True once the host is stopping."""
        return not self._open

    # --- occupancy ---------------------------------------------------------------------

    def is_busy(self, run_id: str) -> bool:
        """True while this host runs, or is about to launch, a worker for the run."""
        return run_id in self.active_runs or run_id in self.pending_claims

    def busy(self, freed: Collection[ActiveRun] = ()) -> int:
        """Worker slots in use: pending starts, and active runs that still hold their claim.

        A run whose own write released its claim (completed, waiting, …) frees its slot
        with that commit; its worker only exits. `freed` are such runs in the transaction
        that releases them.
        """
        freed_runs = {active.run_id for active in freed}
        holding = sum(
            1
            for active in self.active_runs.values()
            if not (active.released or active.run_id in freed_runs)
        )
        return holding + len(self.pending_claims)

    def host_info(self) -> HostInfo:
        return HostInfo(
            host_id=self.host_id,
            epoch=self.epoch,
            active_workers=self.busy(),
            max_workers=self.max_workers,
        )

    def failure(self) -> str | None:
        """The claim plugins' failures in one sentence, or None."""
        return "; ".join(self.failures) or None

    def is_vetoed(self, run_id: str, revision: int) -> bool:
        """True while a remembered veto holds for the run at this revision."""
        return self._vetoes.get(run_id) == revision

    # --- the claim pass ----------------------------------------------------------------

    def schedule_pass(self) -> None:
        """Look for work soon, outside any transaction: a pass from the first candidate,
        after the pass in progress if there is one."""
        if self._place is not None:
            self._pass_again = True  # the pass in progress has its next turn scheduled
            return
        self._schedule_turn()

    def _schedule_turn(self) -> None:
        if self._scheduled or not self._open:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._scheduled_turn)

    def _scheduled_turn(self) -> None:
        self._scheduled = False
        if self._place is None:
            self.claim_free_slots()
        elif self._open:
            self._ask_and_claim()  # the pass in progress goes on

    def poll(self) -> None:
        """The poll timer: the vetoes remembered longest (at most `ASK_PER_TURN`) are
        asked again, since a plugin's reasons may change without anything the host sees;
        then a pass."""
        for run_id in list(itertools.islice(self._vetoes, ASK_PER_TURN)):
            del self._vetoes[run_id]
        self.schedule_pass()

    def settle_unknown_claims(self) -> None:
        """After the database connection came back: a live claim of this host's with no
        worker here is one whose commit seemed to fail (the connection dropped at its
        COMMIT) but happened. Let go of it and its never-launched worker at once, so the
        run does not wait out its lease, and claim again."""
        store, launcher = self.store, self._launcher
        if store is None or launcher is None or not self._open:
            return
        with store.transaction():
            for run_id, generation in run_claims.own_live_claims(self.host_id):
                if run_id in self.active_runs or run_id in self.pending_claims:
                    continue
                if run_claims.release_claim(run_id, generation):
                    launcher.drop_unlaunched(run_id)
        self.schedule_pass()

    def claim_free_slots(self, freed: Collection[ActiveRun] = ()) -> None:
        """The claim pass: claim runs until the host is full or no candidate is left.

        Inside a transaction (a commit group, a start batch, a decision's continuation)
        its claims join that transaction and launch after its commit; `freed` are runs
        whose slots that transaction frees. With claim plugins the pass is deferred to
        just after the commit: hooks are never asked inside a transaction.
        """
        store = self.store
        if not self._open or store is None:
            return
        if not plugins.claim_hooks_are_builtin():
            if store.in_transaction:
                store.after_commit(self.schedule_pass)
            elif self._place is not None:
                self.schedule_pass()  # after the pass in progress
            else:
                self._ask_and_claim()
            return
        self.failures = []
        excluded = set(self.active_runs) | set(self.pending_claims) | self.blocked_runs
        # Claims of this pass whose launch waits for the surrounding commit; outside a
        # transaction a claim launches at once and `busy` already counts it.
        awaiting_commit: set[str] = set()
        while True:
            free = self.max_workers - self.busy(freed)
            free -= len(awaiting_commit - self.pending_claims.keys())
            if free <= 0:
                return
            # PostgreSQL: the candidate query and the claims share one transaction, so the
            # candidates stay locked and other hosts skip them (the host's fence goes with
            # that query); SQLite keeps its write lock for the claim alone.
            scope = (
                contextlib.nullcontext() if store.is_sqlite else store.transaction(fence_later=True)
            )
            with scope:
                # The built-in selection takes the first runs in claim order: as many as
                # there are free slots, so that fewer mean none is left to ask for.
                candidates = run_claims.claim_candidates(self.host_id, excluded, free)
                for run_id in candidates:
                    excluded.add(run_id)
                    if self._claim(run_id, run_claims.new_claim_token()) is not None:
                        awaiting_commit.add(run_id)
            if len(candidates) < free:
                return

    def _ask_and_claim(self) -> None:
        """A turn of a pass with claim plugins, outside any transaction: read candidates
        from the pass's place, ask the hooks about the fresh ones, remember vetoes, claim
        what they chose; the pass goes on in the next turn while candidates are left."""
        place = self._place
        if self._vetoes and self._vetoes_at_load != self.busy():
            self._vetoes.clear()  # the hooks' `host.active_workers` changed
            place = None  # runs behind the place are asked again too
        if place is None:
            self._pass_again = False  # this pass starts from the first candidate
        excluded = set(self.active_runs) | set(self.pending_claims) | self.blocked_runs
        # None until a page is asked: a pass that asks nobody keeps what the last said.
        failures: dict[str, str] | None = None
        read, size = 0, ASK_PER_TURN
        try:
            while self._open and self.busy() < self.max_workers:
                page = run_claims.candidate_revisions(excluded, size, after=place)
                read += len(page)
                fresh = [c for c in page if not self.is_vetoed(c.run_id, c.revision)]
                fresh = fresh[:ASK_PER_TURN]  # of a larger page, read past remembered vetoes
                chosen: set[str] = set()
                if fresh:
                    if failures is None:
                        failures = {}
                    chosen = self._ask_windows(fresh, excluded, failures)
                    place = self._decided_place(page, chosen, place)
                elif page:
                    place = page[-1].place  # remembered vetoes only
                if len(page) < size and (not page or place == page[-1].place):
                    place = None  # every candidate was seen: the pass is over
                    break
                if chosen:
                    continue  # claims changed the queue: read on at once
                if fresh or read >= READ_PER_TURN:
                    break  # the rest in the next turn
                # A page of remembered vetoes: read the rest of the turn's share at once.
                size = READ_PER_TURN - read
        except PiWorkflowsError as error:  # no selection answered at all
            failures = {"": str(error)}
            place = None
        if failures is not None:
            self._note_failures(failures)
        self._end_turn(place)

    def _decided_place(
        self,
        page: list[run_claims.Candidate],
        chosen: set[str],
        place: run_claims.ClaimPlace | None,
    ) -> run_claims.ClaimPlace | None:
        """Where the pass goes on after asking about a page: behind its leading runs that
        are decided, vetoed or chosen (a run left undecided, in a window the hooks were
        not asked about, is read again)."""
        for candidate in page:
            if candidate.run_id not in chosen and not self.is_vetoed(
                candidate.run_id, candidate.revision
            ):
                break
            place = candidate.place
        return place

    def _end_turn(self, place: run_claims.ClaimPlace | None) -> None:
        """The pass goes on from `place` in the next turn, or it is over (None, or no
        free slot): then a pass asked for meanwhile starts from the first candidate."""
        if place is not None and self._open and self.busy() < self.max_workers:
            self._place = place
            self._schedule_turn()
            return
        self._place = None
        if self._pass_again:
            self._pass_again = False
            self._schedule_turn()

    def _ask_windows(
        self, fresh: list[run_claims.Candidate], excluded: set[str], failures: dict[str, str]
    ) -> set[str]:
        """Ask the hooks about `fresh` candidates, a window at a time in one job, and
        claim what they chose; the ids chosen (none: every fresh run was vetoed, or the
        host is full)."""
        revisions = {candidate.run_id: candidate.revision for candidate in fresh}
        records = run_records(list(revisions))
        size = self.claim_window
        windows = [records[start : start + size] for start in range(0, len(records), size)]
        free = self.max_workers - self.busy()
        choice = plugins.choose_runs_to_claim(windows, self.host_info(), free, self.hooks)
        for failure in choice.failures:
            failures[failure.plugin_name] = str(failure)
        if not self._vetoes:
            self._vetoes_at_load = self.busy()
        for run in choice.vetoed:
            self._vetoes.pop(run.run_id, None)  # to the end: remembered the shortest
            self._vetoes[run.run_id] = revisions[run.run_id]
        chosen: set[str] = set()
        for run in choice.chosen:
            if not self._open or self.busy() >= self.max_workers:
                break
            excluded.add(run.run_id)
            chosen.add(run.run_id)
            self._claim_chosen(run)
        return chosen

    def _claim_chosen(self, run: RunRecord) -> None:
        store = self.store
        assert store is not None
        token = run_claims.new_claim_token()
        with store.transaction():
            if run_claims.lock_for_claim(run.run_id):
                self._claim(run.run_id, token, record=run)

    def _note_failures(self, failures: dict[str, str]) -> None:
        for plugin, sentence in self.hooks.hung().items():
            failures.setdefault(plugin, sentence)
        sentences = sorted(failures.values())
        for plugin, sentence in failures.items():
            if sentence in self.failures:
                continue  # every pass repeats it; the log says it once
            if plugin:
                log.error("claim plugin failing, claiming goes on without it: %s", sentence)
            else:
                log.error("claim pass stopped: %s", sentence)
        self.failures = sentences

    # --- targeted claims ---------------------------------------------------------------

    def admit(self, run_id: str) -> bool:
        """Outside a transaction, before `claim_run`: a free slot, and the claim hooks
        allow the run now. With built-in claiming alone only the slot is checked."""
        if not self._open or self.busy() >= self.max_workers:
            return False
        if plugins.claim_hooks_are_builtin():
            return True
        store = self.store
        assert store is not None and not store.in_transaction, "admit() asks plugins"
        run = run_record(run_id)
        choice = plugins.choose_runs_to_claim([[run]], self.host_info(), 1, self.hooks)
        self._note_failures({f.plugin_name: str(f) for f in choice.failures})
        if choice.vetoed:
            self._vetoes[run_id] = run.revision
        return bool(choice.chosen)

    def claim_run(
        self, run_id: str, *, admitted: bool = False, allow_pending_interaction: bool = False
    ) -> GateAnswer:
        """Claim one run now, inside the caller's transaction; its worker launches after
        commit. `admitted`: the caller's `admit(run_id)` said yes just before.

        `allow_pending_interaction` lets a run that waits for its session be claimed to
        validate a submission (SPEC §9.5).
        """
        if not self._open:
            return GateAnswer(None, "taken")
        if self.busy() >= self.max_workers:
            return GateAnswer(None, "full")
        if not (admitted or plugins.claim_hooks_are_builtin()):
            return GateAnswer(None, "ask")
        claim = self._claim(
            run_id,
            run_claims.new_claim_token(),
            allow_pending_interaction=allow_pending_interaction,
        )
        if claim is None:
            return GateAnswer(None, "taken")
        self.blocked_runs.discard(run_id)
        return GateAnswer(claim.generation)

    def release_to_waiting(self, run_id: str, event_type: EventType) -> bool:
        """Park the run of an active worker as `waiting` and let the worker go (in a
        transaction); False when this host no longer holds the run's claim."""
        active = self.active_runs.get(run_id)
        if active is None or not run_claims.park_run(
            run_id, active.claim_token, event_type=event_type, to_waiting=True
        ):
            return False
        active.control = "handoff"
        return True

    # --- the claim itself --------------------------------------------------------------

    def _claim(
        self,
        run_id: str,
        token: str,
        *,
        record: RunRecord | None = None,
        allow_pending_interaction: bool = False,
    ) -> Claim | None:
        """The fenced claim and its worker row, in one transaction; the launch follows
        its commit (at once outside a transaction)."""
        store, launcher = self.store, self._launcher
        assert store is not None and launcher is not None
        with store.transaction():
            claim = run_claims.claim_run(
                run_id,
                self.host_id,
                token,
                lease_ms=self.run_lease_ms,
                allow_pending_interaction=allow_pending_interaction,
            )
            if claim is None:
                return None
            if run_id not in self.active_runs and run_id not in self.pending_claims:
                launcher.drop_unlaunched(run_id)
            worker = launcher.record_worker(run_id, claim)
            if record is None:  # the run as its claim left it, when the claim read it
                record = run_claims.claimed_record(run_id)
                if record is not None:
                    worker = dataclasses.replace(worker, claimed=record)
            store.after_commit(
                functools.partial(self._launch, run_id, token, claim, worker, record)
            )
        return claim

    def _launch(
        self,
        run_id: str,
        token: str,
        claim: Claim,
        worker: PreparedWorker,
        record: RunRecord | None,
    ) -> None:
        """After the claim committed: announce it, and the worker starts."""
        assert self._launcher is not None
        self.pending_claims[run_id] = token
        if record is None:  # (a plugin pass's candidate is the run as it was before its claim)
            record = run_record(run_id)
            worker = dataclasses.replace(worker, claimed=record)
        plugins.run_claimed(record, claim)
        self._launcher.launch(run_id, token, claim, worker)
