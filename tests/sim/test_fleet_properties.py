"""Properties of any small fleet: every request is accounted for once, the invariants hold in
every replica, and a seed gives one answer."""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.fleet.arrivals import arrivals
from sim.fleet.report import summary_lines
from sim.fleet.run import run_fleet
from sim.fleet.stats import OUTCOMES
from sim.fleet.workload import (
    AutoscalingSettings,
    Duration,
    FleetModel,
    KillEvent,
    ReplicaSettings,
    RouterSettings,
    Workload,
)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n_models = draw(st.integers(1, 3))
    models = tuple(
        FleetModel(
            f"m{i}",
            slots=draw(st.integers(1, 3)),
            memory=draw(st.sampled_from([0, 100, 200])),
            load_time_s=draw(st.sampled_from([0.0, 0.3, 2.0])),
            rate=draw(st.sampled_from([0.5, 2.0, 6.0])),
            busy_timeout_ms=draw(st.sampled_from([0, 500])),
            duration=draw(
                st.sampled_from(
                    [
                        Duration("fixed", 0.4),
                        Duration("exponential", 0.5),
                        Duration("normal", 0.3, 0.1),
                    ]
                )
            ),
        )
        for i in range(n_models)
    )
    count = draw(st.integers(1, 4))
    autoscaling = None
    if draw(st.booleans()):
        autoscaling = AutoscalingSettings(
            min_replicas=1,
            max_replicas=draw(st.integers(1, 5)),
            target_ongoing_requests=draw(st.sampled_from([1.0, 2.0])),
            upscale_delay_s=draw(st.sampled_from([0.0, 2.0])),
            downscale_delay_s=draw(st.sampled_from([1.0, 5.0])),
            look_back_period_s=2.0,
            interval_s=0.5,
        )
    events = ()
    if draw(st.booleans()):
        events = (
            KillEvent(draw(st.sampled_from([0.0, 1.0, 4.5])), draw(st.integers(0, count - 1))),
        )
    return Workload(
        name="drawn",
        models=models,
        replicas=ReplicaSettings(
            count=count,
            max_ongoing_requests=draw(st.integers(1, 4)),
            start_time_s=draw(st.sampled_from([0.0, 1.0])),
            max_loaded_models=draw(st.integers(0, 2)),
            memory_budget=draw(st.sampled_from([0, 250])),
            busy_timeout_ms=draw(st.sampled_from([0, 1000])),
            max_queue=draw(st.sampled_from([None, 0, 1])),
        ),
        router=RouterSettings(
            max_queued_requests=draw(st.sampled_from([None, 0, 3])),
            retries=draw(st.integers(0, 2)),
        ),
        autoscaling=autoscaling,
        duration_s=draw(st.sampled_from([4.0, 8.0])),
        events=events,
        scheduling=draw(st.sampled_from([None, "together", "one_at_a_time"])),
    )


@given(workloads(), st.integers(0, 50))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_request_is_accounted_once_and_the_invariants_hold(w: Workload, seed: int) -> None:
    s = run_fleet(w, seed)
    expected = len(list(arrivals(w, seed)))
    assert s.requests == expected == sum(s.counts[o] for o in OUTCOMES)
    assert not s.violations, s.violations
    assert sum(r.latency.count for r in s.per_replica) == s.counts["ok"] == s.latency.count
    assert [m.model for m in s.per_model] == [m.id for m in w.models]
    assert sum(m.requests for m in s.per_model) == s.requests
    assert sum(m.latency.count for m in s.per_model) == s.counts["ok"]
    assert sum(m.busy for m in s.per_model) == s.counts["busy"] + s.counts["backpressure"]
    assert all(r.latency.count == 0 or r.latency.p50 > 0 for r in s.per_replica)
    if w.router.max_queued_requests is None:
        assert s.counts["backpressure"] == 0
    if not w.events:
        assert s.counts["failed"] == 0
    again = run_fleet(attrs.evolve(w), seed)
    assert summary_lines("x", seed, again) == summary_lines("x", seed, s)
