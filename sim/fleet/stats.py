"""What a fleet run measured: per-request outcomes and latencies, overall and per replica.

Latency is from arrival to the response (routing, back-pressure waits,
retries, the replica's queue and load, the run). Percentiles are over
successful requests (nearest rank); the busy rate counts every 503 a client
received (the router's back-pressure, or a replica's ``server_busy`` after the
ingress ran out of retries) over every request.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import attrs

OK = "ok"
BUSY = "busy"  # a replica's 503 server_busy, after the ingress's retries
BACKPRESSURE = "backpressure"  # the router's max_queued_requests (Ray's BackPressureError)
FAILED = "failed"  # the replica died under the request
ERROR = "error"  # any other error (a failed load)
OUTCOMES = (OK, BUSY, BACKPRESSURE, FAILED, ERROR)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted ``values`` (nan when empty)."""
    if not values:
        return math.nan
    return values[max(0, math.ceil(q * len(values)) - 1)]


@attrs.frozen
class Latencies:
    """p50/p95/p99 and the count of a sample."""

    count: int
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Latencies:
        ordered = sorted(values)
        return cls(
            len(ordered),
            percentile(ordered, 0.50),
            percentile(ordered, 0.95),
            percentile(ordered, 0.99),
        )


@attrs.frozen
class ReplicaSummary:
    """One replica's share: requests it served, its latencies, 503s it answered, deaths."""

    rid: int
    latency: Latencies
    sent: int  # requests the router sent it (a retried request counts on each replica)
    busy_answers: int
    failed: int  # requests in flight when it died or was killed (retried or not)
    loads: int
    started_at: float | None
    stopped_at: float | None

    @property
    def busy_rate(self) -> float:
        """503s it answered, over the requests sent to it."""
        return self.busy_answers / self.sent if self.sent else 0.0


@attrs.frozen
class ModelSummary:
    """One model's share: its requests, their latencies, the 503s its clients received."""

    model: str
    requests: int
    latency: Latencies
    busy: int

    @property
    def busy_rate(self) -> float:
        return self.busy / self.requests if self.requests else 0.0


@attrs.frozen
class FleetSummary:
    """The answer for one run."""

    replicas: int  # at start
    requests: int
    counts: dict[str, int]
    latency: Latencies
    per_replica: tuple[ReplicaSummary, ...]
    end_time: float
    peak_replicas: int
    violations: tuple[str, ...]
    residency: dict[int, tuple[tuple[float, tuple[str, ...]], ...]]
    scale: tuple[tuple[float, int], ...]  # (time, running replicas) whenever it changed
    warnings: tuple[str, ...] = ()  # events that could not happen (a kill of no replica)
    per_model: tuple[ModelSummary, ...] = ()

    @property
    def busy_rate(self) -> float:
        """503s a client received, over every request."""
        if not self.requests:
            return 0.0
        return (self.counts[BUSY] + self.counts[BACKPRESSURE]) / self.requests

    @property
    def failed_rate(self) -> float:
        if not self.requests:
            return 0.0
        return (self.counts[FAILED] + self.counts[ERROR]) / self.requests


class Recorder:
    """Collects outcomes as the run goes (compact arrays: a million requests fit)."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self.ok = array("d")
        self.by_replica: dict[int, array[float]] = {}
        self.by_model: dict[str, array[float]] = {}
        self.by_model_counts: dict[str, dict[str, int]] = {}
        self.busy_answers: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.failed: dict[int, int] = {}

    def record(self, outcome: str, latency: float, replica: int | None, model: str) -> None:
        """One request's end."""
        self.counts[outcome] += 1
        per_model = self.by_model_counts.setdefault(model, {})
        per_model[outcome] = per_model.get(outcome, 0) + 1
        if outcome == OK:
            self.ok.append(latency)
            self.by_model.setdefault(model, array("d")).append(latency)
            assert replica is not None
            self.by_replica.setdefault(replica, array("d")).append(latency)

    def lost_on(self, replica: int) -> None:
        """``replica`` died under a request (whether or not the ingress retried it)."""
        self.failed[replica] = self.failed.get(replica, 0) + 1

    def sent_to(self, replica: int) -> None:
        """The router sent a request to ``replica``."""
        self.sent[replica] = self.sent.get(replica, 0) + 1

    def busy_answer(self, replica: int) -> None:
        """A replica answered 503 (whether or not the ingress retried elsewhere)."""
        self.busy_answers[replica] = self.busy_answers.get(replica, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())
