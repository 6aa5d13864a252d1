"""pi-workflows-otel in a real host, exporting over OTLP/HTTP to a receiver on a real
socket that decodes the protobuf export requests the SDK's exporter sends, as a collector
would."""

from __future__ import annotations

import gzip
import hashlib
import json
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from pi_workflows.testing import WorkflowHost, short_temp_dir, wait_until

FAILING = """
from pi_workflows import compute, edge, workflow


def broken(ctx):
    raise ValueError("the input has no name")


WORKFLOW = workflow(
    name="failing",
    start_at="fine",
    nodes={"fine": compute(lambda ctx: {"ok": True}), "broken": compute(broken)},
    edges=[edge("fine", "broken")],
)
"""


# Its node kills its own worker (SIGKILL) the first time, then completes.
CRASHING = """
import os
import signal
from pathlib import Path

from pi_workflows import compute, workflow


def crash_once(ctx):
    marker = Path.cwd() / "crashed-once"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"survived": True}


WORKFLOW = workflow(
    name="crashing", start_at="crash", nodes={"crash": compute(crash_once)}, edges=[]
)
"""


class Collector:
    """An OTLP/HTTP receiver (``/v1/traces``, ``/v1/metrics``): each export request is
    decoded from protobuf and answered the way a collector answers it."""

    def __init__(self) -> None:
        self.traces: queue.Queue[ExportTraceServiceRequest] = queue.Queue()
        self.metrics: queue.Queue[ExportMetricsServiceRequest] = queue.Queue()
        self.content_types: set[str] = set()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.content_types.add(self.headers.get("Content-Type", ""))
                if self.path == "/v1/traces":
                    collector.traces.put(ExportTraceServiceRequest.FromString(body))
                    reply = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    collector.metrics.put(ExportMetricsServiceRequest.FromString(body))
                    reply = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self._spans: list[dict[str, Any]] = []
        self._points: list[dict[str, Any]] = []

    def spans(self) -> list[dict[str, Any]]:
        """Every span received so far, flattened: name, ids, times, attributes, status."""
        while not self.traces.empty():
            request = self.traces.get()
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self._spans.append(
                            {
                                "name": span.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": _attributes(span.attributes),
                                "status": Status.StatusCode.Name(span.status.code),
                                "message": span.status.message,
                                "events": [event.name for event in span.events],
                                "links": [link.span_id.hex() for link in span.links],
                                "resource": resource,
                                "scope": scope_spans.scope.name,
                            }
                        )
        return list(self._spans)

    def points(self) -> list[dict[str, Any]]:
        """Every metric data point received so far: metric name, attributes, value."""
        while not self.metrics.empty():
            request = self.metrics.get()
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            value = (
                                point.count
                                if kind == "histogram"
                                else getattr(point, point.WhichOneof("value"))
                            )
                            self._points.append(
                                {
                                    "metric": metric.name,
                                    "unit": metric.unit,
                                    "attributes": _attributes(point.attributes),
                                    "value": value,
                                }
                            )
        return list(self._points)


def _attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    collector = Collector()
    yield collector
    collector.server.shutdown()
    collector.server.server_close()


@pytest.fixture
def otel_host(collector: Collector) -> Iterator[WorkflowHost]:
    """A real host with the installed ``otel`` entry point, exporting to `collector`
    within a fraction of a second of each span and metric reading."""
    host = WorkflowHost(short_temp_dir())
    host.use_entry_points("otel")
    host.env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_SERVICE_NAME": "workflows-under-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
        }
    )
    try:
        yield host
    finally:
        host.cleanup()


def _run_trace_id(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).digest()[:16].hex()


def _spans_of(
    host: WorkflowHost, collector: Collector, run_id: str, count: int
) -> list[dict[str, Any]]:
    trace_id = _run_trace_id(run_id)
    try:
        return wait_until(
            lambda: (
                len(spans := [s for s in collector.spans() if s["trace"] == trace_id]) >= count
                and spans
            ),
            what=f"{count} spans of run {run_id} at the collector",
        )
    except AssertionError as error:
        got = [(s["name"], s["trace"] == trace_id) for s in collector.spans()]
        raise AssertionError(f"{error}; received {got}; host log:\n{host.host_log()}") from None


def test_the_branch_example_is_one_trace_whose_spans_match_its_nodes(
    otel_host: WorkflowHost, collector: Collector, branch_executor: str
):
    otel_host.add_plugin("scripted_executor", branch_executor)
    otel_host.start(PI_WORKFLOWS_AGENT_EXECUTOR="scripted")
    run_id = otel_host.start_run("branch", {"task": "Tidy up the README."})
    otel_host.wait_for_status(run_id, "completed")

    spans = _spans_of(otel_host, collector, run_id, 3)
    (run,) = [s for s in spans if s["parent"] == ""]
    nodes = sorted((s for s in spans if s["parent"]), key=lambda s: s["start"])
    # The nodes the run went through, in order: the decision, then the lane it chose.
    assert [s["name"] for s in nodes] == ["node classify", "node continue_lane"]
    assert run["name"] == "run branch" and run["status"] == "STATUS_CODE_OK"
    assert run["attributes"]["pi_workflows.run.id"] == run_id
    assert run["attributes"]["pi_workflows.run.status"] == "completed"
    assert run["events"] == ["queued", "claimed", "running", "completed"]
    assert run["resource"]["service.name"] == "workflows-under-test"
    assert run["scope"] == "pi_workflows"
    for node in nodes:
        assert node["parent"] == run["id"]
        assert run["start"] <= node["start"] <= node["end"] <= run["end"]
        assert node["status"] == "STATUS_CODE_OK"
        attributes = node["attributes"]
        assert attributes["pi_workflows.node.kind"] == "agent"
        assert attributes["pi_workflows.node.attempt"] == 1
        assert attributes["pi_workflows.node.outcome"] == "completed"
        assert attributes["pi_workflows.agent.executor"] == "scripted"
        assert attributes["gen_ai.provider.name"] == "local"
        assert attributes["gen_ai.request.model"] == "tiny-1"
        assert attributes["gen_ai.usage.input_tokens"] == 120
        assert attributes["gen_ai.usage.output_tokens"] == 7
    assert nodes[0]["end"] <= nodes[1]["start"]
    assert collector.content_types == {"application/x-protobuf"}


def _point(collector: Collector, metric: str, **attributes: Any) -> dict[str, Any]:
    return wait_until(
        lambda: next(
            (
                p
                for p in reversed(collector.points())
                if p["metric"] == metric and attributes.items() <= p["attributes"].items()
            ),
            None,
        ),
        what=f"a {metric} data point with {attributes}",
    )


def test_a_failed_node_and_run_export_their_error_and_the_run_metrics(
    otel_host: WorkflowHost, collector: Collector
):
    otel_host.write_workflow("failing", FAILING)
    otel_host.start()
    run_id = otel_host.start_run("failing")
    otel_host.wait_for_status(run_id, "failed")

    spans = _spans_of(otel_host, collector, run_id, 3)
    by_name = {s["name"]: s for s in spans}
    broken = by_name["node broken"]
    assert broken["status"] == "STATUS_CODE_ERROR"
    assert broken["message"] == "the input has no name"
    assert broken["attributes"]["error.type"] == "ValueError"
    assert broken["attributes"]["pi_workflows.node.outcome"] == "failed"
    assert by_name["node fine"]["status"] == "STATUS_CODE_OK"
    run = by_name["run failing"]
    assert run["status"] == "STATUS_CODE_ERROR"
    assert run["attributes"]["pi_workflows.run.status"] == "failed"

    workflow = {"pi_workflows.workflow.name": "failing"}
    assert _point(collector, "pi_workflows.runs.started", **workflow)["value"] == 1
    finished = _point(
        collector, "pi_workflows.runs.finished", **workflow, **{"pi_workflows.run.status": "failed"}
    )
    assert finished["value"] == 1
    assert _point(collector, "pi_workflows.claim.latency", **workflow)["value"] == 1
    assert _point(collector, "pi_workflows.run.duration", **workflow)["unit"] == "s"
    failed = {**workflow, "pi_workflows.node.outcome": "failed"}
    failed_attempts = _point(collector, "pi_workflows.node_attempts", **failed)
    assert failed_attempts["value"] == 1
    # Read from the state database on the exporter's thread: nothing waits now.
    assert _point(collector, "pi_workflows.queue.depth")["value"] == 0


def test_a_run_waiting_for_a_human_decision_exports_its_wait_and_its_continuation(
    otel_host: WorkflowHost, collector: Collector
):
    otel_host.start()
    run_id = otel_host.start_run("human-decision")
    otel_host.wait_for_status(run_id, "waiting")
    (decision,) = json.loads(otel_host.cli("decision", "list", "--json").stdout)
    answer = otel_host.cli("decision", "answer", decision["decisionId"], "continue", "--json")
    continuation = json.loads(answer.stdout)["receipt"]["continuationRunId"]
    otel_host.wait_for_status(continuation, "completed")

    # The answered run stays `waiting`; its span ends when its continuation is created.
    (waiting, proposal, approve) = sorted(
        _spans_of(otel_host, collector, run_id, 3), key=lambda s: (s["parent"] != "", s["start"])
    )
    assert [proposal["name"], approve["name"]] == ["node proposal", "node approve"]
    assert waiting["name"] == "run human-decision"
    assert waiting["attributes"]["pi_workflows.run.status"] == "waiting"
    assert waiting["attributes"]["pi_workflows.run.continued_by"] == continuation
    assert waiting["events"] == ["queued", "claimed", "running", "waiting"]
    continued = _spans_of(otel_host, collector, continuation, 2)
    (run,) = [s for s in continued if s["parent"] == ""]
    assert run["links"] == [waiting["id"]]
    assert run["attributes"]["pi_workflows.run.parent_id"] == run_id
    assert [s["name"] for s in continued if s["parent"]] == ["node continued"]

    wait = _point(
        collector,
        "pi_workflows.run.wait.duration",
        **{"pi_workflows.workflow.name": "human-decision"},
    )
    assert wait["value"] == 1 and wait["unit"] == "s"


def test_a_killed_worker_counts_as_a_crash(otel_host: WorkflowHost, collector: Collector):
    otel_host.write_workflow("crashing", CRASHING)
    otel_host.start()
    run_id = otel_host.start_run("crashing")
    wait_until(lambda: (otel_host.project / "crashed-once").exists(), what="the first worker")
    crashes = _point(
        collector,
        "pi_workflows.worker.crashes",
        **{"pi_workflows.workflow.name": "crashing", "pi_workflows.worker.signal": 9},
    )
    assert crashes["value"] == 1
    # The node had started (progress): the host runs it again, and the clean exit of the
    # second worker is no crash.
    otel_host.wait_for_status(run_id, "completed")
    assert (
        max(p["value"] for p in collector.points() if p["metric"] == "pi_workflows.worker.crashes")
        == 1
    )


def test_a_bad_otel_setting_is_one_log_line_and_the_host_runs_on(otel_host: WorkflowHost):
    otel_host.start(OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    run_id = otel_host.start_run("hello")
    otel_host.wait_for_status(run_id, "completed")
    log = otel_host.host_log()
    assert "OTLP protocol 'grpc' is not supported by pi-workflows-otel" in log
    assert log.count("pi-workflows-otel exports nothing") == 1
