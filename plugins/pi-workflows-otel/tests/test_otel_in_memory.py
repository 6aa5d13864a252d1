"""pi-workflows-otel in a running host (its loop in a thread of the test process, its
workers real processes), with the SDK's in-memory exporter and metric reader in place of
OTLP: the spans and metrics the host's notifications make, read back as the SDK holds
them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from piw_otel import hooks
from piw_otel.telemetry import COUNTERS, DURATIONS, Telemetry

from pi_workflows.testing import InProcessHost, wait_until

# In a run's input (so in its output too) and its origin session: neither may reach telemetry.
PAYLOAD, SESSION = "PAYLOAD-7f3a", "sess-5d1e-private"


@dataclass
class InMemory:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def spans_of(self, run_id: str, count: int) -> list[ReadableSpan]:
        """The spans of `run_id`'s trace, once there are `count`, oldest first."""

        def of_run() -> list[ReadableSpan]:
            return [
                span
                for span in self.spans.get_finished_spans()
                if span.attributes and span.attributes.get("pi_workflows.run.id") == run_id
            ]

        wait_until(lambda: len(of_run()) >= count, what=f"{count} spans of run {run_id}")
        return sorted(of_run(), key=lambda span: span.start_time or 0)

    def points(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Metric name -> (attributes, value) of each data point collected now (a
        histogram's value is its count)."""
        collected: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.metrics.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else []:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", getattr(point, "count", None))
                        collected.setdefault(metric.name, []).append(
                            (dict(point.attributes or {}), value)
                        )
        return collected


@pytest.fixture
def telemetry(in_process_host: InProcessHost) -> Iterator[InMemory]:
    """The ``otel`` plugin in `in_process_host`, its telemetry held in memory."""
    in_memory = InMemory(InMemorySpanExporter(), InMemoryMetricReader())
    built = Telemetry(
        span_processor=SimpleSpanProcessor(in_memory.spans), metric_readers=[in_memory.metrics]
    )
    hooks.use(built)
    in_process_host.use_entry_points("otel")
    try:
        yield in_memory
    finally:
        in_process_host.stop()
        hooks.use(None)
        built.shutdown()


def test_a_run_is_a_span_with_a_child_span_per_node_attempt_and_its_metrics(
    in_process_host: InProcessHost, telemetry: InMemory, branch_executor: str
):
    in_process_host.add_plugin("scripted_executor", branch_executor)
    in_process_host.start(PI_WORKFLOWS_AGENT_EXECUTOR="scripted")
    run_id = in_process_host.start_run("branch", {"task": "Tidy up the README."})
    in_process_host.wait_for_status(run_id, "completed")

    run, classify, lane = telemetry.spans_of(run_id, 3)
    assert run.name == "run branch" and run.parent is None
    assert run.status.status_code is StatusCode.OK
    assert dict(run.attributes or {}) == {
        "pi_workflows.workflow.name": "branch",
        "pi_workflows.run.id": run_id,
        "pi_workflows.run.status": "completed",
        "pi_workflows.run.execution_mode": "headless",
    }
    assert [event.name for event in run.events] == ["queued", "claimed", "running", "completed"]
    assert run.resource.attributes["service.name"] == "pi-workflows"
    assert run.instrumentation_scope is not None
    assert run.instrumentation_scope.name == "pi_workflows"
    # The nodes the run went through, in order, each a child of the run's span.
    assert [classify.name, lane.name] == ["node classify", "node continue_lane"]
    assert run.context is not None
    for node, node_id in ((classify, "classify"), (lane, "continue_lane")):
        assert node.parent is not None and node.parent.span_id == run.context.span_id
        assert node.context is not None and node.context.trace_id == run.context.trace_id
        assert (run.start_time or 0) <= (node.start_time or 0) <= (node.end_time or 0)
        assert (node.end_time or 0) <= (run.end_time or 0)
        assert node.status.status_code is StatusCode.OK
        attributes = dict(node.attributes or {})
        attempt_id = attributes.pop("pi_workflows.node.attempt_id")
        assert isinstance(attempt_id, str) and attempt_id
        assert attributes == {
            "pi_workflows.run.id": run_id,
            "pi_workflows.workflow.name": "branch",
            "pi_workflows.node.id": node_id,
            "pi_workflows.node.kind": "agent",
            "pi_workflows.node.attempt": 1,
            "pi_workflows.node.outcome": "completed",
            "pi_workflows.agent.executor": "scripted",
            "gen_ai.provider.name": "local",
            "gen_ai.request.model": "tiny-1",
            "gen_ai.usage.input_tokens": 120,
            "gen_ai.usage.output_tokens": 7,
        }
    assert (classify.end_time or 0) <= (lane.start_time or 0)

    workflow = {"pi_workflows.workflow.name": "branch"}
    points = wait_until(
        lambda: "pi_workflows.runs.finished" in (found := telemetry.points()) and found,
        what="the run's metrics",
    )
    # Every counter and histogram the plugin declares was recorded by this one run.
    declared = {name for name, _, _ in COUNTERS.values()} | {n for n, _ in DURATIONS.values()}
    assert declared - set(points) == {
        "pi_workflows.worker.crashes",  # no worker crashed
        "pi_workflows.run.wait.duration",  # nothing waited for input
    }
    assert points["pi_workflows.runs.started"] == [(workflow, 1)]
    assert points["pi_workflows.runs.finished"] == [
        ({**workflow, "pi_workflows.run.status": "completed"}, 1)
    ]
    assert points["pi_workflows.claim.latency"] == [(workflow, 1)]
    assert points["pi_workflows.run.duration"] == [
        ({**workflow, "pi_workflows.run.status": "completed"}, 1)
    ]
    completed_agent = {
        **workflow,
        "pi_workflows.node.kind": "agent",
        "pi_workflows.node.outcome": "completed",
    }
    assert points["pi_workflows.node_attempts"] == [(completed_agent, 2)]
    assert points["pi_workflows.node_attempt.duration"] == [(completed_agent, 2)]
    assert sorted(points["pi_workflows.agent.tokens"], key=lambda p: p[0]["gen_ai.token.type"]) == [
        ({**workflow, "gen_ai.request.model": "tiny-1", "gen_ai.token.type": "input"}, 240),
        ({**workflow, "gen_ai.request.model": "tiny-1", "gen_ai.token.type": "output"}, 14),
    ]
    # The gauges read the state database when collected: nothing queued or running now.
    assert points["pi_workflows.queue.depth"] == [({}, 0)]
    assert "pi_workflows.runs.running" not in points


def _texts(span: ReadableSpan) -> list[str]:
    """Every text a span carries: its name, status, attributes, events and their attributes."""
    texts = [span.name, span.status.description or ""]
    texts += [f"{key}={value}" for key, value in (span.attributes or {}).items()]
    for event in span.events:
        texts.append(event.name)
        texts += [f"{key}={value}" for key, value in (event.attributes or {}).items()]
    return texts


def test_no_input_output_or_session_id_reaches_a_span_or_a_metric(
    in_process_host: InProcessHost, telemetry: InMemory
):
    in_process_host.start()
    # An interactive run from a session; its output greets its input.
    run_id = in_process_host.start_run("hello", {"name": PAYLOAD}, session=SESSION)
    status = in_process_host.wait_for_status(run_id, "completed")
    assert PAYLOAD in str(status)  # the run did carry it

    spans = telemetry.spans_of(run_id, 2)
    assert [span.name for span in spans] == ["run hello", "node greet"]
    assert dict(spans[0].attributes or {})["pi_workflows.run.execution_mode"] == "interactive"
    points = telemetry.points()
    carried = [text for span in spans for text in _texts(span)]
    carried += [f"{name} {attributes}" for name, found in points.items() for attributes, _ in found]
    for secret in (PAYLOAD, SESSION):
        assert not [text for text in carried if secret in text], secret
