"""Prometheus metrics, derived from the same decision records as the trace.

Gauges (active slots, queue depth, loaded) are read from the runtime at scrape
time; counters and durations come from core's decision records as they are
made (admissions and rejections by reason, loads, teardowns); request latency
is measured by the HTTP layer per model and route.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.events import TraceRecord

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _Gauges(Collector):
    def __init__(self, status: Callable[[], list[Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self.status()
        families = {
            "voxpool_active_slots": ("Occupied request slots", "active_slots"),
            "voxpool_queued_requests": ("Requests waiting in the FIFO", "queued_requests"),
            "voxpool_queued_management": (
                "Management operations waiting in the FIFO",
                "queued_management",
            ),
            "voxpool_slots": ("Configured slots", "slots"),
        }
        for name, (doc, attr) in families.items():
            g = GaugeMetricFamily(name, doc, labels=["model"])
            for row in rows:
                g.add_metric([row.id], float(getattr(row, attr)))
            yield g
        g = GaugeMetricFamily(
            "voxpool_model_loaded", "1 when a complete pool is published", labels=["model"]
        )
        for row in rows:
            g.add_metric([row.id], 1.0 if row.loaded else 0.0)
        yield g


class Metrics:
    """The server's registry; feed it decision records with :meth:`observe`."""

    def __init__(self, status: Callable[[], list[Any]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Gauges(status))
        self.admissions = Counter(
            "voxpool_admissions",
            "Admission decisions",
            ["model", "kind", "decision"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "voxpool_rejections",
            "Admission rejections and expiries by reason",
            ["model", "reason"],
            registry=self.registry,
        )
        self.load_seconds = Histogram(
            "voxpool_load_seconds",
            "Pool load duration (weights, primary, clones)",
            ["model", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.teardown_seconds = Histogram(
            "voxpool_teardown_seconds",
            "Pool teardown duration",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "voxpool_request_seconds",
            "HTTP request latency",
            ["model", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.connections_aborted = Counter(
            "voxpool_connections_aborted",
            "Connections aborted because a client I/O deadline ran out",
            ["kind"],
            registry=self.registry,
        )
        self.clients_gone = Counter(
            "voxpool_clients_gone",
            "Requests whose client went away before a response started (logged as 499)",
            ["route"],
            registry=self.registry,
        )
        self.batch_steps = Counter(
            "voxpool_batch_steps",
            "Batched steps run by a batching model's decode task",
            ["model"],
            registry=self.registry,
        )
        self.batch_members = Counter(
            "voxpool_batch_members",
            "Members advanced by those steps (divided by the steps: the mean batch size)",
            ["model"],
            registry=self.registry,
        )
        for kind in ("header", "body", "write", "shutdown"):
            self.connections_aborted.labels(kind)
        self._load_started: dict[str, float] = {}
        self._teardown_started: dict[str, float] = {}

    def observe(self, r: TraceRecord) -> None:
        """Update counters from one decision record.

        Uses its typed ``fields``, never its summary text.
        """
        f = r.fields
        if r.event in ("request", "manage"):
            kind = "request" if r.event == "request" else "management"
            self.admissions.labels(r.model, kind, f["outcome"]).inc()
            if f["outcome"] == "rejected":
                self.rejections.labels(r.model, r.reason).inc()
        elif r.event in ("expire", "release", "cancel") and f.get("expired"):
            self.rejections.labels(r.model, "queue_timeout").inc(len(f["expired"]))
        elif r.event in ("ensure_loaded", "begin_load") and f.get("outcome") in ("room", "refused"):
            if f["load"] is not None:
                self._load_started[r.model] = r.t
            for victim, _ticket in f["evict"]:
                self._teardown_started[victim] = r.t
        elif r.event in ("load_succeeded", "load_failed"):
            start = self._load_started.pop(r.model, None)
            if start is not None:
                outcome = "ok" if r.event == "load_succeeded" else "failed"
                self.load_seconds.labels(r.model, outcome).observe(max(0.0, r.t - start))
        elif r.event in ("begin_unload", "commit_reconfigure") and f.get("teardown") is not None:
            self._teardown_started[r.model] = r.t
        elif r.event == "retire_idle":
            for victim, _ticket in f["evict"]:
                self._teardown_started[victim] = r.t
        elif r.event == "batch_step":
            self.batch_steps.labels(r.model).inc()
            self.batch_members.labels(r.model).inc(len(f["advance"]))
        elif r.event == "unload_finished":
            start = self._teardown_started.pop(r.model, None)
            if start is not None:
                self.teardown_seconds.labels(r.model).observe(max(0.0, r.t - start))

    def render(self) -> bytes:
        return generate_latest(self.registry)
