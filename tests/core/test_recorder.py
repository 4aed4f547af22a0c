"""core.recorder: a record's summary is rendered from its typed fields, one renderer per call."""

from __future__ import annotations

from typing import Any

import pytest

from core.events import Reason, TraceRecord
from core.recorder import SUMMARIES, Core, summarize
from core.registry import Registered
from core.residency import ResidencyLimits


def test_every_core_call_has_a_renderer() -> None:
    calls = {name for name in vars(Core) if not name.startswith("_") and name != "entry"}
    assert calls == set(SUMMARIES)


WAKEUPS = {"granted": [[7, 1], [9, None]], "expired": [4, 5]}


@pytest.mark.parametrize(
    ("event", "fields", "summary"),
    [
        ("new_ticket", {"ticket": 12}, "12"),
        ("register", {"outcome": "registered", "ticket": 3}, "registered ticket=3"),
        ("register", {"outcome": "existing", "ticket": None}, "existing"),
        (
            "request",
            {"outcome": "granted", "ticket": 5, "slot": 1, "generation": 2, "fast": True},
            "granted slot=1 gen=2 fast=1",
        ),
        (
            "manage",
            {"outcome": "granted", "ticket": 5, "slot": None, "generation": 0, "fast": False},
            "granted slot=x gen=0 fast=0",
        ),
        ("manage", {"outcome": "queued", "position": 3}, "queued pos=3"),
        (
            "try_acquire",
            {"outcome": "rejected", "reason": "busy", "retry_after": 2},
            "rejected",
        ),
        ("expire", WAKEUPS, "granted=[7:1,9:x] expired=[4,5]"),
        ("cancel", {"was": "queued", **WAKEUPS}, "queued granted=[7:1,9:x] expired=[4,5]"),
        (
            "release",
            {"double": False, "used": True, "granted": [], "expired": []},
            "granted=[] expired=[] used",
        ),
        (
            "release",
            {"double": True, "used": False, "granted": [], "expired": []},
            "double granted=[] expired=[]",
        ),
        ("ensure_loaded", {"outcome": "proceed", "generation": 1}, "proceed gen=1"),
        ("ensure_loaded", {"outcome": "wait", "initializer": 4}, "wait initializer=4"),
        (
            "ensure_loaded",
            {"outcome": "room", "evict": [["a", 8], ["b", 9]], "load": 7, "retry": None},
            "room evict=[a:8,b:9] load=7",
        ),
        (
            "begin_load",
            {"outcome": "refused", "evict": [], "load": None, "retry": 6},
            "refused evict=[] retry=6",
        ),
        ("load_succeeded", {"proceed": [5, 7]}, "proceed=[5, 7]"),
        ("load_failed", {"retry": None}, "retry="),
        ("load_failed", {"retry": 3}, "retry=3"),
        ("abandon_wait", {"left": "initializer", "retry": 4}, "initializer retry=4"),
        ("begin_unload", {"teardown": 2}, "teardown gen=2"),
        ("commit_reconfigure", {"teardown": None}, "nothing"),
        ("set_memory", {"ok": False}, "refused"),
        (
            "bulk_publish",
            {"tickets": {"a": 3, "b": 4}, "ready": ["a"], "missing": ["ghost"]},
            "tickets={'a': 3, 'b': 4} ready=['a'] missing=['ghost']",
        ),
        ("retire_idle", {"evict": [["idle", 7], ["old", 8]]}, "[idle:7,old:8]"),
        ("retire_idle", {"evict": []}, "[]"),
        ("stop_admitting", {}, "ok"),
        ("reject_reconfigure", {}, "ok"),
    ],
)
def test_summaries_render_the_fields(event: str, fields: dict[str, Any], summary: str) -> None:
    """The trace format: these strings are what traces already hold (replay compares them)."""
    assert summarize(event, fields) == summary


def test_recorded_summaries_are_their_fields_rendered_also_after_a_json_round_trip() -> None:
    records: list[TraceRecord] = []
    core = Core(ResidencyLimits(max_loaded_models=1), sink=records.append)
    for model in ("a", "b"):
        registered = core.register(model, 2, 0, 0.0)
        assert isinstance(registered, Registered)
        core.release(model, registered.lease.ticket, 0.0)
    core.register("a", 2, 0, 0.0)
    t1, t2, t3 = (core.new_ticket(0.0) for _ in range(3))
    core.request("a", t1, 0.0, None)
    core.ensure_loaded("a", t1, 0.0)
    core.request("a", t2, 0.0, None)
    core.ensure_loaded("a", t2, 0.0)
    core.load_succeeded("a", t1, 2, 0.5)
    core.manage("a", t3, 0.5, 1.0)
    core.release("a", t1, 1.0)
    core.release("a", t1, 1.0)
    core.expire("a", 2.0)
    core.release("a", t2, 2.5)
    t4 = core.new_ticket(3.0)
    core.request("b", t4, 3.0, None)
    core.ensure_loaded("b", t4, 3.0)
    core.load_failed("b", t4, 3.2)
    core.cancel("b", t4, 3.5)
    core.begin_unload("b", 4.0)
    core.begin_reconfigure("b", 4.0)
    core.reject_reconfigure("b", 4.0, Reason.CAPACITY_EXCEEDED)
    core.bulk_publish(["a", "ghost"], 5.0)
    core.retire_idle(9.0, 1.0)
    assert {r.event for r in records} >= {"release", "expire", "cancel", "ensure_loaded"}
    for record in records:
        back = TraceRecord.from_json(record.to_json())
        assert summarize(record.event, record.fields) == record.decision
        assert summarize(back.event, back.fields) == back.decision == record.decision
    rejected = next(r for r in records if r.event == "reject_reconfigure")
    assert (rejected.decision, rejected.reason) == ("ok", "capacity_exceeded")
