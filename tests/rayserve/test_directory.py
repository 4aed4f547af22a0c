"""server.ray.directory: the fleet-wide /v1/models and /metrics from replica reports."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")

from prometheus_client.parser import text_string_to_metric_families

import server.ray.directory as directory_module
from server.ray.broadcast import merge
from server.ray.directory import (
    STALE_S,
    Ack,
    Command,
    Directory,
    Report,
    fleet_metrics,
    fleet_models,
)
from server.ray.exchange import Forwarded


def row(model: str, loaded: bool, active: int = 0, queued: int = 0) -> dict[str, object]:
    return {
        "id": model,
        "object": "model",
        "task": "tts",
        "slots": 2,
        "active_slots": active,
        "queued_requests": queued,
        "queued_management": 0,
        "loaded": loaded,
        "state": "loaded" if loaded else "unloaded",
    }


METRICS_A = """# HELP voxpool_active_slots Occupied request slots
# TYPE voxpool_active_slots gauge
voxpool_active_slots{model="p"} 1.0
# HELP voxpool_admissions_total Admission decisions
# TYPE voxpool_admissions_total counter
voxpool_admissions_total{decision="granted"} 3.0
"""
METRICS_B = """# HELP voxpool_active_slots Occupied request slots
# TYPE voxpool_active_slots gauge
voxpool_active_slots{model="p"} 0.0
"""

REPORTS = [
    Report("b", [row("p", True, active=1, queued=2), row("w", False)], METRICS_B, ("p",)),
    Report("a", [row("p", False), row("w", True, active=2)], METRICS_A),
]


def test_models_sum_counters_and_say_where_each_model_is_loaded() -> None:
    rows = {r["id"]: r for r in fleet_models(REPORTS)}
    assert list(rows) == ["p", "w"]
    p = rows["p"]
    assert (p["replicas"], p["slots"], p["active_slots"], p["queued_requests"]) == (2, 4, 1, 2)
    assert p["loaded"] is True and p["loaded_on"] == ["b"]
    assert [(r["replica"], r["routed"]) for r in p["per_replica"]] == [("b", True), ("a", False)]
    assert p["task"] == "tts" and "state" not in p
    assert rows["w"]["loaded_on"] == ["a"] and rows["w"]["active_slots"] == 2


def test_no_reports_no_models() -> None:
    assert fleet_models([]) == []


def test_metrics_label_every_sample_with_its_replica_and_stay_valid_exposition() -> None:
    text = fleet_metrics(REPORTS).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    active = families["voxpool_active_slots"]
    assert active.type == "gauge"
    assert sorted((s.labels["replica"], s.value) for s in active.samples) == [
        ("a", 1.0),
        ("b", 0.0),
    ]
    granted = families["voxpool_admissions"].samples
    assert [(s.labels, s.value) for s in granted] == [
        ({"decision": "granted", "replica": "a"}, 3.0)
    ]
    assert text.count("# TYPE voxpool_active_slots") == 1  # one family, not one per replica


def test_the_directory_keeps_the_latest_report_and_drops_the_silent_and_the_departed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(directory_module.time, "monotonic", lambda: now[0])
    d = Directory()
    d.report(Report("r1", [row("p", False)], ""))
    d.report(Report("r2", [], ""))
    d.report(Report("r1", [row("p", True)], ""))
    assert [(r.replica, len(r.models)) for r in d.reports()] == [("r1", 1), ("r2", 0)]
    assert d.reports()[0].models[0]["loaded"] is True
    d.leave("r2")
    assert [r.replica for r in d.reports()] == ["r1"]
    now[0] += STALE_S + 0.1
    assert d.reports() == []


# ---------------------------------------------------------------- the command log

UNLOAD = Forwarded("POST", "/v1/models/unload", b"", (), b'{"id": "p"}')


def live_directory(*replicas: str) -> Directory:
    d = Directory()
    for r in replicas:
        d.report(Report(r, [], ""))
    return d


def test_a_command_needs_a_live_replica() -> None:
    assert live_directory().post(UNLOAD) == "no model replica is running"


def test_each_replica_runs_the_log_from_where_it_stopped_and_a_new_epoch_from_the_start() -> None:
    d = live_directory("a")
    first, second = d.post(UNLOAD), d.post(UNLOAD)
    assert isinstance(first, Command) and isinstance(second, Command)
    assert (first.seq, second.seq, first.epoch) == (1, 2, d.epoch)
    assert d.report(Report("a", [], ""), "", 0) == [first, second]
    assert d.report(Report("a", [], ""), d.epoch, 1) == [second]
    assert d.report(Report("a", [], ""), d.epoch, 2) == []
    assert d.report(Report("a", [], ""), "an older directory's epoch", 2) == [first, second]


def test_a_command_waits_for_every_replica_live_at_its_post_until_it_answers_or_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(directory_module.time, "monotonic", lambda: now[0])
    d = live_directory("a", "b")
    command = d.post(UNLOAD)
    assert isinstance(command, Command)
    d.report(Report("c", [], ""))  # joined after the post: it runs the log, nobody waits for it
    assert d.outcome(command.seq).waiting == ("a", "b")
    d.ack(command.seq, Ack("b", 200, b"{}"))
    assert d.outcome(command.seq).waiting == ("a",)
    now[0] += STALE_S + 1  # "a" fell silent (killed): the command waits no longer
    d.report(Report("b", [], ""))
    outcome = d.outcome(command.seq)
    assert outcome.waiting == () and [a.replica for a in outcome.acks] == ["b"]


def test_a_command_every_replica_refused_is_not_run_by_later_replicas() -> None:
    d = live_directory("a")
    refused, kept = d.post(UNLOAD), d.post(UNLOAD)
    assert isinstance(refused, Command) and isinstance(kept, Command)
    d.ack(refused.seq, Ack("a", 403, b"{}"))
    d.ack(kept.seq, Ack("a", 200, b"{}"))
    d.outcome(refused.seq)
    d.outcome(kept.seq)
    assert d.report(Report("new", [], ""), "", 0) == [kept]


def ack(replica: str, status: int, body: dict[str, object]) -> Ack:
    return Ack(replica, status, json.dumps(body).encode())


def test_merge_unions_what_any_replica_unloaded_and_keeps_what_none_knows() -> None:
    start, body = merge(
        [
            ack("a", 200, {"unloaded": ["x"], "not_found": ["q", "r"]}),
            ack("b", 200, {"unloaded": ["y", "x"], "not_found": ["r"]}),
        ]
    )
    assert start.status == 200
    assert json.loads(body) == {"unloaded": ["x", "y"], "not_found": ["r"], "replicas": 2}
    start, body = merge(
        [ack("a", 200, {"id": "m", "reconfigured": False}), ack("b", 200, {"reconfigured": True})]
    )
    assert json.loads(body) == {"id": "m", "reconfigured": True, "replicas": 2}


def test_merge_answers_with_the_first_failure_as_its_replica_gave_it() -> None:
    start, body = merge(
        [ack("a", 200, {}), ack("b", 403, {"error": "no"}), ack("c", 400, {"error": "x"})]
    )
    assert (start.status, body) == (403, b'{"error": "no"}')
