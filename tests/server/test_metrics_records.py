"""Metrics read core's typed decision fields: a core run fed straight into Metrics."""

from __future__ import annotations

from core.admission import Granted
from core.events import TraceRecord
from core.recorder import Core
from core.registry import Registered
from core.residency import ResidencyLimits
from server.metrics import Metrics


def test_metrics_count_admissions_expiries_loads_and_evictions_from_fields() -> None:
    records: list[TraceRecord] = []
    metrics = Metrics(lambda: [])
    core = Core(
        ResidencyLimits(max_loaded_models=1), sink=lambda r: (records.append(r), metrics.observe(r))
    )
    for model in ("a", "b"):
        registered = core.register(model, 1, 0, 0.0)
        assert isinstance(registered, Registered)
        core.release(model, registered.lease.ticket, 0.0)
    t1 = core.new_ticket(0.0)
    assert isinstance(core.request("a", t1, 0.0, None), Granted)
    core.ensure_loaded("a", t1, 0.0)
    core.load_succeeded("a", t1, 1, 0.5)
    t2 = core.new_ticket(0.6)
    core.request("a", t2, 0.6, 1.0)  # queued behind t1 with a 1 s bound
    core.expire("a", 2.0)  # t2's deadline passed
    core.release("a", t1, 2.5)
    t3 = core.new_ticket(3.0)
    core.request("b", t3, 3.0, None)
    room = core.ensure_loaded("b", t3, 3.0)  # 'a' is idle: evicted for 'b'
    core.unload_finished("a", 3.2)
    assert [e.model for e in room.evictions] == ["a"]  # type: ignore[union-attr]

    def sample(name: str, **labels: str) -> float:
        value = metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    assert sample("voxpool_admissions_total", model="a", kind="request", decision="granted") == 1
    assert sample("voxpool_admissions_total", model="a", kind="request", decision="queued") == 1
    assert sample("voxpool_rejections_total", model="a", reason="queue_timeout") == 1
    assert sample("voxpool_load_seconds_count", model="a", outcome="ok") == 1
    assert sample("voxpool_load_seconds_sum", model="a", outcome="ok") == 0.5
    assert sample("voxpool_teardown_seconds_count", model="a") == 1
    assert abs(sample("voxpool_teardown_seconds_sum", model="a") - 0.2) < 1e-9
    assert all(r.fields for r in records if r.event != "unload_finished"), (
        "every decision carries fields"
    )
    back = [TraceRecord.from_json(r.to_json()) for r in records]
    assert [b.fields for b in back] == [json_view(r.fields) for r in records]


def json_view(fields: object) -> object:
    import json

    return json.loads(json.dumps(fields))
