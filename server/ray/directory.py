"""The fleet directory: what every replica last reported, and the fleet-wide views.

Each model replica sends a :class:`Report` (its own ``/v1/models`` rows and
``/metrics`` text) every half second to one named Ray actor per application
(:class:`Directory`). The ingress reads them to answer ``GET /v1/models``
(:func:`fleet_models`: per model, the replicas that host it, where it is
loaded, and the sums of slots, active slots and queued requests) and
``GET /metrics`` (:func:`fleet_metrics`: every replica's samples with a
``replica`` label). A replica that stops reporting for :data:`STALE_S`
(killed, node lost) drops out of both views; one that shuts down cleanly
leaves at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

STALE_S = 3.0
"""A replica silent for this long is left out of the fleet views."""

COUNTERS = ("slots", "active_slots", "queued_requests", "queued_management")
"""The per-replica counters that ``/v1/models`` sums over the fleet."""


@attrs.frozen
class Report:
    """One replica's state: its ``/v1/models`` rows and its ``/metrics`` text."""

    replica: str
    models: Sequence[Mapping[str, Any]]
    metrics: str


class Directory:
    """The latest report of every live replica of one application (a Ray actor)."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, Report]] = {}

    def report(self, report: Report) -> None:
        """Keep ``report`` as its replica's latest."""
        self._reports[report.replica] = (time.monotonic(), report)

    def leave(self, replica: str) -> None:
        """Forget ``replica`` (it shut down)."""
        self._reports.pop(replica, None)

    def reports(self) -> list[Report]:
        """The reports of the replicas heard from within :data:`STALE_S`, by replica id."""
        now = time.monotonic()
        fresh = [r for at, r in self._reports.values() if now - at <= STALE_S]
        return sorted(fresh, key=lambda r: r.replica)


def directory_name(app_name: str) -> str:
    """The Ray actor name of ``app_name``'s directory."""
    return f"voxpool-directory-{app_name}"


def directory(app_name: str) -> Any:
    """A handle on ``app_name``'s directory actor, started if it is not running.

    The actor belongs to whoever started it (an ingress or a model replica)
    and ends with it; every user asks again after a failed call, so a new one
    takes over within a report interval and the app leaves nothing behind.
    """
    actor = ray.remote(num_cpus=0)(Directory)
    return actor.options(
        name=directory_name(app_name), namespace="serve", get_if_exists=True
    ).remote()


def fleet_models(reports: Iterable[Report]) -> list[dict[str, Any]]:
    """``/v1/models`` for the fleet: each model's row with counters summed over replicas.

    ``replicas`` is how many replicas host the model, ``loaded_on`` the ids of
    those that have it loaded (``loaded`` is true when any has), and
    ``per_replica`` each replica's own counters.
    """
    rows: dict[str, dict[str, Any]] = {}
    for report in reports:
        for row in report.models:
            model = rows.get(row["id"])
            if model is None:
                model = rows[row["id"]] = {
                    **{k: v for k, v in row.items() if k not in (*COUNTERS, "loaded", "state")},
                    **dict.fromkeys(COUNTERS, 0),
                    "replicas": 0,
                    "loaded": False,
                    "loaded_on": [],
                    "per_replica": [],
                }
            model["replicas"] += 1
            for counter in COUNTERS:
                model[counter] += row[counter]
            if row["loaded"]:
                model["loaded"] = True
                model["loaded_on"].append(report.replica)
            model["per_replica"].append(
                {"replica": report.replica, "state": row["state"], "loaded": row["loaded"]}
                | {counter: row[counter] for counter in COUNTERS}
            )
    return [rows[model] for model in sorted(rows)]


class _Fleet:
    """A prometheus_client collector over already-merged metric families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def fleet_metrics(reports: Iterable[Report]) -> bytes:
    """``/metrics`` for the fleet: every replica's samples, labelled ``replica``."""
    merged: dict[str, Metric] = {}
    for report in reports:
        for family in text_string_to_metric_families(report.metrics):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            into.samples.extend(
                Sample(s.name, {**s.labels, "replica": report.replica}, s.value, s.timestamp)
                for s in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fleet([merged[name] for name in sorted(merged)]))
    return generate_latest(registry)
