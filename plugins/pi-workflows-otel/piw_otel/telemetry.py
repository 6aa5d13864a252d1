"""Spans and metrics of one process's runs and node attempts, built on opentelemetry-sdk.

A run is one trace. Its ids are derived from the run id, so every span of a run lands in
the same trace whichever host (or restart of one) records it, and a node attempt's span
can name its run's span as parent before that span exists: the run span is recorded when
the run ends, from its creation to its end, with a span event per status change this
process announced. A node attempt's span is recorded when the attempt ends, from its
start to its end. Nothing is kept open across notifications, so a host that stops loses
no half-built span (only the batch not yet exported).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from pi_workflows.plugin import NodeAttemptRecord, RunRecord, StateView, state_view

from .settings import Settings

SCOPE = "pi_workflows"
SERVICE_NAME = "pi-workflows"
TERMINAL = ("completed", "failed", "timed_out", "cancelled")
# Runs whose status changes this process remembers (for span events and wait times):
# a run created here and ended on another host must not be remembered for ever.
MAX_TRACKED_RUNS = 10_000
MAX_EVENTS_PER_RUN = 64
_MS = 1_000_000  # nanoseconds in a millisecond
_Read = TypeVar("_Read")

log = logging.getLogger("piw_otel")


def run_span_context(run_id: str, sampled: bool) -> SpanContext:
    """The ids of a run's span: the same in every process, derived from the run id."""
    digest = hashlib.sha256(run_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)


class _RunIds(IdGenerator):
    """Random ids, except for a run span: `pinned` hands the SDK the run's own ids."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._local = threading.local()

    @contextlib.contextmanager
    def pinned(self, ids: SpanContext) -> Iterator[None]:
        self._local.ids = ids
        try:
            yield
        finally:
            self._local.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return ids.trace_id if ids is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return ids.span_id if ids is not None else self._random.generate_span_id()


@dataclass
class _RunSeen:
    """What this process saw of a run that has not ended yet."""

    events: list[tuple[str, str | None, str | None, int]] = field(default_factory=list)
    waiting_since: int | None = None  # epoch ms of its `waiting` transition


# The counters: key -> (metric name, unit, description).
COUNTERS = {
    "runs_started": ("pi_workflows.runs.started", "{run}", "Runs created."),
    "runs_finished": ("pi_workflows.runs.finished", "{run}", "Runs ended, by status."),
    "node_attempts": ("pi_workflows.node_attempts", "{attempt}", "Node attempts ended."),
    "worker_crashes": (
        "pi_workflows.worker.crashes",
        "{worker}",
        "Workers that died or broke the protocol without saying they would.",
    ),
    "agent_tokens": ("pi_workflows.agent.tokens", "{token}", "Tokens agent steps used."),
}
# The histograms, all in seconds: key -> (metric name, description).
DURATIONS = {
    "run_duration": ("pi_workflows.run.duration", "From a run's creation to its end."),
    "claim_latency": (
        "pi_workflows.claim.latency",
        "From when a run could be claimed to when a host claimed it.",
    ),
    "wait_duration": (
        "pi_workflows.run.wait.duration",
        "How long a run waited for input (a human decision, a checkpoint, a session's agent "
        "step) before it went on.",
    ),
    "node_attempt_duration": ("pi_workflows.node_attempt.duration", "Node attempt durations."),
}


class Telemetry:
    """The providers, instruments and bookkeeping of one process.

    Spans go to `span_processor` (none: no traces) and metrics to `metric_readers`;
    :meth:`from_settings` builds them from the ``OTEL_*`` variables, and an application
    that embeds a host (or a test, with the SDK's in-memory exporter and reader) passes
    its own and hands the result to :func:`piw_otel.hooks.use`.
    """

    def __init__(
        self,
        *,
        span_processor: SpanProcessor | None = None,
        metric_readers: Sequence[MetricReader] = (),
    ) -> None:
        resource = _resource()
        version = _own_version()
        self._ids = _RunIds()
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, _RunSeen] = OrderedDict()
        self.tracer_provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if span_processor is not None:
            self.tracer_provider = TracerProvider(resource=resource, id_generator=self._ids)
            self.tracer_provider.add_span_processor(span_processor)
            self._tracer = self.tracer_provider.get_tracer(SCOPE, version)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=list(metric_readers))
        meter = self.meter_provider.get_meter(SCOPE, version)
        self._count = {
            key: meter.create_counter(name, unit=unit, description=description)
            for key, (name, unit, description) in COUNTERS.items()
        }
        self._seconds = {
            key: meter.create_histogram(name, unit="s", description=description)
            for key, (name, description) in DURATIONS.items()
        }
        meter.create_observable_gauge(
            "pi_workflows.queue.depth",
            callbacks=[self._observe_queue_depth],
            unit="{run}",
            description="Runs waiting for a worker, in the whole state database.",
        )
        meter.create_observable_gauge(
            "pi_workflows.runs.running",
            callbacks=[self._observe_running],
            unit="{run}",
            description="Runs with a worker, in the whole state database, by workflow.",
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Telemetry:
        """Exporters as the ``OTEL_*`` variables chose: spans in batches, metrics at the
        export interval."""
        processor = None
        if settings.traces != "none":
            exporter = OTLPSpanExporter() if settings.traces == "otlp" else ConsoleSpanExporter()
            processor = BatchSpanProcessor(exporter)
        readers: list[MetricReader] = []
        if settings.metrics != "none":
            metric_exporter = (
                OTLPMetricExporter() if settings.metrics == "otlp" else ConsoleMetricExporter()
            )
            readers.append(PeriodicExportingMetricReader(metric_exporter))
        return cls(span_processor=processor, metric_readers=readers)

    def _record_seconds(self, key: str, since: int, until: int, attributes: Any) -> None:
        """Record `until - since` (epoch ms; never below 0) in seconds on histogram `key`."""
        self._seconds[key].record(max(0, until - since) / 1000, attributes)

    # --- notifications ---------------------------------------------------------------

    def run_transition(
        self, run_id: str, old: str | None, new: str, detail: str | None, workflow: str, at: int
    ) -> None:
        attributes = {"pi_workflows.workflow.name": workflow}
        created = old is None and new == "queued"
        if created:
            self._count["runs_started"].add(1, attributes)
        with self._lock:
            seen = self._forget(run_id)
            if len(seen.events) < MAX_EVENTS_PER_RUN:
                seen.events.append((new, old, detail, at))
            waited_since = seen.waiting_since if old == "waiting" else None
            seen.waiting_since = at if new == "waiting" else None
            if new not in TERMINAL:
                self._runs[run_id] = seen  # most recently changed last
                while len(self._runs) > MAX_TRACKED_RUNS:
                    self._runs.popitem(last=False)
        if waited_since is not None:
            self._record_seconds("wait_duration", waited_since, at, attributes)
        if new in TERMINAL:
            self._run_ended(run_id, new, detail, workflow, at, seen.events)
        elif created:
            self._continuation_created(run_id, workflow, at)

    def _continuation_created(self, run_id: str, workflow: str, at: int) -> None:
        """An answered human decision continues its waiting run in a new run: for a
        trace, that ends the waiting run's wait, and the run (it stays ``waiting``)."""
        record = _run_record(run_id)
        if record is None or record.lineage_kind != "continuation" or not record.parent_run_id:
            return
        parent_id = record.parent_run_id
        with self._lock:
            parent = self._forget(parent_id)
        parent_workflow = record.workflow_name
        if parent.waiting_since is not None:
            self._record_seconds(
                "wait_duration",
                parent.waiting_since,
                at,
                {"pi_workflows.workflow.name": parent_workflow},
            )
        self._run_span(
            parent_id,
            "waiting",
            None,
            parent_workflow,
            at,
            parent.events,
            {"pi_workflows.run.continued_by": run_id},
        )

    def _forget(self, run_id: str) -> _RunSeen:
        """What this process saw of a run, taken out of its memory (under the lock)."""
        return self._runs.pop(run_id, None) or _RunSeen()

    def run_claimed(self, run: RunRecord) -> None:
        claimable_since = max(run.available_at, run.created_at)
        self._record_seconds(
            "claim_latency",
            claimable_since,
            int(time.time() * 1000),
            {"pi_workflows.workflow.name": run.workflow_name},
        )

    def worker_exited(self, run_id: str, outcome: str, signal: int | None) -> None:
        if outcome != "crashed":
            return
        record = _run_record(run_id)
        attributes: dict[str, Any] = {
            "pi_workflows.workflow.name": record.workflow_name if record else ""
        }
        if signal is not None:
            attributes["pi_workflows.worker.signal"] = signal
        self._count["worker_crashes"].add(1, attributes)

    def node_attempt_finished(self, attempt: NodeAttemptRecord) -> None:
        finished_at = attempt.finished_at or attempt.started_at
        outcome = attempt.outcome or "unknown"
        attributes = {
            "pi_workflows.workflow.name": attempt.workflow_name,
            "pi_workflows.node.kind": attempt.node_kind,
            "pi_workflows.node.outcome": outcome,
        }
        self._count["node_attempts"].add(1, attributes)
        self._record_seconds("node_attempt_duration", attempt.started_at, finished_at, attributes)
        agent = attempt.agent or {}
        for kind, count in _token_counts(agent.get("usage")):
            self._count["agent_tokens"].add(
                count,
                {
                    "pi_workflows.workflow.name": attempt.workflow_name,
                    "gen_ai.request.model": str(agent.get("model", "")),
                    "gen_ai.token.type": kind,
                },
            )
        if self._tracer is None:
            return
        parent = trace.NonRecordingSpan(self._run_ids(attempt.run_id, attempt.workflow_name))
        span = self._tracer.start_span(
            f"node {attempt.node_id}",
            context=trace.set_span_in_context(parent, otel_context.Context()),
            start_time=attempt.started_at * _MS,
            attributes={
                "pi_workflows.run.id": attempt.run_id,
                "pi_workflows.workflow.name": attempt.workflow_name,
                "pi_workflows.node.id": attempt.node_id,
                "pi_workflows.node.kind": attempt.node_kind,
                "pi_workflows.node.attempt": attempt.attempt_number,
                "pi_workflows.node.attempt_id": attempt.attempt_id,
                "pi_workflows.node.outcome": outcome,
                **_agent_attributes(agent),
            },
        )
        if outcome == "completed":
            span.set_status(Status(StatusCode.OK))
        elif outcome in ("failed", "timed_out"):
            if attempt.error_class:
                span.set_attribute("error.type", attempt.error_class)
            span.set_status(Status(StatusCode.ERROR, attempt.error_message or outcome))
        span.end(end_time=finished_at * _MS)

    # --- the run span --------------------------------------------------------------

    def _run_ended(
        self,
        run_id: str,
        status: str,
        detail: str | None,
        workflow: str,
        at: int,
        events: list[tuple[str, str | None, str | None, int]],
    ) -> None:
        created_at = self._run_span(run_id, status, detail, workflow, at, events)
        attributes = {"pi_workflows.workflow.name": workflow, "pi_workflows.run.status": status}
        self._count["runs_finished"].add(1, attributes)
        if created_at is not None:
            self._record_seconds("run_duration", created_at, at, attributes)

    def _run_span(
        self,
        run_id: str,
        status: str,
        detail: str | None,
        workflow: str,
        at: int,
        events: list[tuple[str, str | None, str | None, int]],
        extra: dict[str, Any] | None = None,
    ) -> int | None:
        """Record the run's span, from its creation to `at`; its creation time (epoch
        ms), or None when neither the state nor this process knows it."""
        record = _run_record(run_id)
        known = [e[3] for e in events]
        created_at = record.created_at if record is not None else min(known, default=None)
        if self._tracer is None or created_at is None:
            return created_at
        span_attributes: dict[str, Any] = {
            "pi_workflows.workflow.name": workflow,
            "pi_workflows.run.id": run_id,
            "pi_workflows.run.status": status,
            **(extra or {}),
        }
        links = []
        if record is not None:
            span_attributes["pi_workflows.run.execution_mode"] = record.execution_mode
            if record.parent_run_id is not None:
                span_attributes["pi_workflows.run.parent_id"] = record.parent_run_id
                span_attributes["pi_workflows.run.lineage"] = record.lineage_kind or ""
                links.append(Link(self._run_ids(record.parent_run_id, workflow)))
        with self._ids.pinned(self._run_ids(run_id, workflow)):
            span = self._tracer.start_span(
                f"run {workflow}",
                context=otel_context.Context(),  # a root span, whatever is current
                start_time=created_at * _MS,
                attributes=span_attributes,
                links=links,
            )
        for new, old, event_detail, event_at in events:
            event_attributes = {"pi_workflows.run.previous_status": old or ""}
            if event_detail:
                event_attributes["pi_workflows.run.detail"] = event_detail
            span.add_event(new, event_attributes, timestamp=event_at * _MS)
        if status == "completed":
            span.set_status(Status(StatusCode.OK))
        elif status in ("failed", "timed_out"):
            span.set_status(Status(StatusCode.ERROR, detail or status))
        span.end(end_time=at * _MS)
        return created_at

    def _run_ids(self, run_id: str, workflow: str) -> SpanContext:
        """The run span's ids, sampled as the configured sampler decides for that trace."""
        assert self.tracer_provider is not None
        unsampled = run_span_context(run_id, sampled=False)
        decision = self.tracer_provider.sampler.should_sample(
            None, unsampled.trace_id, f"run {workflow}"
        ).decision
        return run_span_context(run_id, sampled=decision.is_sampled())

    # --- gauges, read from the state database on the metric reader's thread ----------

    def _observe_queue_depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        depth = _read_state("queue depth", lambda view: view.queue_depth())
        return [] if depth is None else [Observation(depth)]  # skipped this time, if unread

    def _observe_running(self, _options: CallbackOptions) -> Iterable[Observation]:
        running = _read_state("running runs", lambda view: view.running_runs())
        if running is None:
            return []
        counts: dict[str, int] = {}
        for run in running:
            counts[run.workflow_name] = counts.get(run.workflow_name, 0) + 1
        return [
            Observation(count, {"pi_workflows.workflow.name": name})
            for name, count in sorted(counts.items())
        ]

    def shutdown(self) -> None:
        """Export what is left and stop the exporters' threads."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def _read_state(what: str, read: Callable[[StateView], _Read]) -> _Read | None:
    """`read` of this process's state view, or None when it cannot be read (no state
    database here, or it is unavailable): what needed it does without, this time."""
    try:
        return read(state_view())
    except Exception as error:
        log.debug("%s not read: %s", what, type(error).__name__)
        return None


def _run_record(run_id: str) -> RunRecord | None:
    """The run's record; without it a span starts at the first change this process saw."""
    return _read_state("run record", lambda view: view.run(run_id))


def _token_counts(usage: Any) -> list[tuple[str, int]]:
    """(token type, count) of an agent's reported usage: ``input`` and ``output``."""
    if not isinstance(usage, dict):
        return []
    return [
        (kind, count)
        for kind in ("input", "output")
        if isinstance(count := usage.get(kind), int) and count >= 0
    ]


def _agent_attributes(agent: dict[str, Any]) -> dict[str, Any]:
    """An agent step's executor, provider, model and token usage, as span attributes."""
    if not agent:
        return {}
    attributes: dict[str, Any] = {"pi_workflows.agent.executor": str(agent.get("executor", ""))}
    if "provider" in agent:
        attributes["gen_ai.provider.name"] = str(agent["provider"])
    if "model" in agent:
        attributes["gen_ai.request.model"] = str(agent["model"])
    for kind, count in _token_counts(agent.get("usage")):
        attributes[f"gen_ai.usage.{kind}_tokens"] = count
    return attributes


def _resource() -> Resource:
    """``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, with ``pi-workflows`` as the
    service name when neither names one."""
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    return resource


def _own_version() -> str:
    try:
        return importlib.metadata.version("pi-workflows-otel")
    except importlib.metadata.PackageNotFoundError:
        return "0"
