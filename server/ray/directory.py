"""The fleet directory: what every replica last reported, management for every replica,
and the fleet-wide views.

Each model replica sends a :class:`Report` (its own ``/v1/models`` rows and
``/metrics`` text) every half second to one named Ray actor per application
(:class:`Directory`). The ingress reads them to answer ``GET /v1/models``
(:func:`fleet_models`: per model, the replicas that host it, where it is
loaded, and the sums of slots, active slots and queued requests) and
``GET /metrics`` (:func:`fleet_metrics`: every replica's samples with a
``replica`` label). A replica that stops reporting for :data:`STALE_S`
(killed, node lost) drops out of both views; one that shuts down cleanly
leaves at once.

Management requests (load, unload, bulk unload) must reach every replica:
the ingress posts them to the directory's command log (:meth:`Directory.post`),
each replica picks up the commands it has not run with its next report, runs
them in order through its own app and acknowledges each
(:meth:`Directory.ack`); the ingress answers once every replica that was live
when the command was posted has acknowledged it, or has gone
(:meth:`Directory.outcome`). A replica that starts later runs the whole log, so
models registered at run time reach new replicas too. The log lives as long as
the directory: a new directory (its owner died) starts a new ``epoch`` and an
empty log, and replicas start over on it (the actor is detached, so only its
own failure or :func:`end_directory` ends it).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from server.ray.exchange import Forwarded

STALE_S = 3.0
"""A replica silent for this long is left out of the fleet views."""

MAX_COMMANDS = 10_000
"""The command log's length bound: past it, management requests are refused."""

COUNTERS = ("slots", "active_slots", "queued_requests", "queued_management")
"""The per-replica counters that ``/v1/models`` sums over the fleet."""


@attrs.frozen
class Report:
    """One replica's state: its ``/v1/models`` rows, its ``/metrics`` text, and the models
    Ray routes to it (its multiplexed model ids)."""

    replica: str
    models: Sequence[Mapping[str, Any]]
    metrics: str
    routed: tuple[str, ...] = ()


@attrs.frozen
class Command:
    """A management request for every replica, numbered in the log of one directory epoch."""

    epoch: str
    seq: int
    request: Forwarded


@attrs.frozen
class Ack:
    """One replica's answer to a command."""

    replica: str
    status: int
    body: bytes


@attrs.frozen
class Outcome:
    """Where a command stands: the replicas still to answer, and the answers so far."""

    waiting: tuple[str, ...]
    acks: tuple[Ack, ...]


class Directory:
    """The latest report of every live replica of one application, and its command log
    (a Ray actor)."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, Report]] = {}
        self.epoch = uuid.uuid4().hex
        self._log: list[Command] = []
        self._expected: dict[int, tuple[str, ...]] = {}
        self._acks: dict[int, dict[str, Ack]] = {}
        self._void: set[int] = set()

    def report(self, report: Report, epoch: str = "", done: int = 0) -> list[Command]:
        """Keep ``report`` as its replica's latest; the commands it has still to run.

        ``epoch`` and ``done`` say how far the replica got: the last command it
        ran in which log. A replica new to this epoch runs the log from the start.
        """
        self._reports[report.replica] = (time.monotonic(), report)
        start = done if epoch == self.epoch else 0
        return [c for c in self._log[start:] if c.seq not in self._void]

    def post(self, request: Forwarded) -> Command | str:
        """Append ``request`` to the log for every live replica; or why it cannot be."""
        live = tuple(r.replica for r in self.reports())
        if not live:
            return "no model replica is running"
        if len(self._log) >= MAX_COMMANDS:
            return "the fleet's management log is full: redeploy with the models in the config"
        command = Command(self.epoch, len(self._log) + 1, request)
        self._log.append(command)
        self._expected[command.seq] = live
        self._acks[command.seq] = {}
        return command

    def ack(self, seq: int, ack: Ack) -> None:
        """Record a replica's answer to command ``seq`` (of this epoch)."""
        if seq in self._acks:
            self._acks[seq][ack.replica] = ack

    def outcome(self, seq: int) -> Outcome:
        """The replicas that were live at the post, are live still and have not answered.

        A command every replica refused (a 4xx: a bad token, a bad body) is
        voided once answered: replicas that start later do not run it.
        """
        acks = self._acks.get(seq, {})
        live = {r.replica for r in self.reports()}
        waiting = tuple(r for r in self._expected.get(seq, ()) if r in live and r not in acks)
        if not waiting and acks and all(400 <= a.status < 500 for a in acks.values()):
            self._void.add(seq)
        return Outcome(waiting, tuple(acks[r] for r in sorted(acks)))

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

    The actor is detached: it belongs to no replica, so no replica's death
    takes the command log with it (every user asks again after a failed call,
    so should the actor itself die a new one takes over within a report
    interval). ``voxpool ray serve`` ends it with the application
    (:func:`end_directory`); after ``serve delete`` it stays, with its log,
    for a redeploy of the same application name.
    """
    actor = ray.remote(num_cpus=0)(Directory)
    return actor.options(
        name=directory_name(app_name), namespace="serve", get_if_exists=True, lifetime="detached"
    ).remote()


def end_directory(app_name: str) -> None:
    """End ``app_name``'s directory actor, if it runs."""
    with contextlib.suppress(ValueError):  # there is none
        ray.kill(ray.get_actor(directory_name(app_name), namespace="serve"))


def fleet_models(reports: Iterable[Report]) -> list[dict[str, Any]]:
    """``/v1/models`` for the fleet: each model's row with counters summed over replicas.

    ``replicas`` is how many replicas host the model, ``loaded_on`` the ids of
    those that have it loaded (``loaded`` is true when any has), and
    ``per_replica`` each replica's own counters and whether Ray routes the
    model's requests to it (``routed``).
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
                | {"routed": row["id"] in report.routed}
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
