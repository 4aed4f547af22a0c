"""The router model (Ray Serve's power of two choices with multiplexed-model affinity) and the
autoscaling policy, decision by decision."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fleet.autoscaler import Autoscaler, desired_replicas
from sim.fleet.router import Router, RoutingContext
from sim.fleet.workload import AutoscalingSettings, RouterSettings


def router(n: int = 4, max_ongoing: int = 4, seed: int = 0, **kw: object) -> Router:
    r = Router(RouterSettings(**kw), max_ongoing, random.Random(seed))  # type: ignore[arg-type]
    for i in range(n):
        r.add(i)
    return r


def test_a_model_loaded_on_one_replica_gets_its_requests_there_while_it_has_room() -> None:
    r = router(4)
    r.set_loaded(2, ("a",))
    for _ in range(50):
        assert r.pick("a", RoutingContext(0.0), 0.0) == 2
    # full: the first attempt finds no room, the next ones fall back to the fewest-models
    # replicas (not 2, which has one model loaded)
    r.ongoing[2] = 4
    ctx = RoutingContext(0.0)
    assert r.pick("a", ctx, 0.0) is None
    assert r.pick("a", ctx, 0.0) in (0, 1, 3)


def test_a_model_loaded_nowhere_goes_to_the_replicas_with_the_fewest_models() -> None:
    r = router(4)
    r.set_loaded(0, ("x", "y"))
    r.set_loaded(1, ("x",))
    r.set_loaded(3, ("y",))
    assert r.fewest_models() == [2]
    assert r.pick("a", RoutingContext(0.0), 0.0) == 2
    # as in Ray: once the model is in the fallback set, a request's first attempt has no
    # candidate (no replica has it); its immediate retry goes to the fewest-models replicas
    ctx = RoutingContext(0.0)
    assert r.pick("a", ctx, 0.0) is None
    assert r.backoff(ctx) == 0.0
    assert r.pick("a", ctx, 0.0) == 2
    r.set_loaded(2, ("z",))
    assert r.fewest_models() == [1, 2, 3]


def test_after_the_matching_timeout_fewest_once_then_every_replica() -> None:
    r = router(3, multiplex_timeout_s=1.0)
    r.set_loaded(0, ("a",))
    r.set_loaded(1, ("b", "c"))
    ctx = RoutingContext(0.0)
    assert r.candidates("a", ctx, 5.0) == [2]  # past even 2x the timeout: fewest (2 has none)
    assert r.candidates("a", ctx, 5.0) == [0, 1, 2]


def test_p2c_picks_the_shorter_queue_of_its_two_choices() -> None:
    r = router(2)
    r.set_loaded(0, ("m",))
    r.set_loaded(1, ("m",))
    r.ongoing.update({0: 3, 1: 1})
    for _ in range(20):
        assert r.pick("m", RoutingContext(0.0), 0.0) == 1


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=12),
    st.integers(0, 2**32),
    st.integers(1, 6),
)
@settings(max_examples=300, deadline=None)
def test_select_takes_the_least_loaded_chosen_replica_with_room(
    ongoing: list[int], seed: int, cap: int
) -> None:
    r = router(len(ongoing), max_ongoing=cap, seed=seed)
    r.ongoing.update(enumerate(ongoing))
    chosen = r.two_choices(r.routable)
    assert len(chosen) == min(2, len(ongoing)) and len(set(chosen)) == len(chosen)
    pick = r.select(chosen)
    room = [c for c in chosen if ongoing[c] < cap]
    if not room:
        assert pick is None
    else:
        assert pick in room and ongoing[pick] == min(ongoing[c] for c in room)


def test_back_pressure_backoff_follows_rays_sequence() -> None:
    r = router(1, max_ongoing=1)
    r.ongoing[0] = 1
    ctx = RoutingContext(0.0)
    assert r.pick("m", ctx, 0.0) is None
    delays = [r.backoff(ctx) for _ in range(8)]
    assert delays == pytest.approx([0.0, 0.025, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5])


def test_max_queued_requests_refuses_at_the_bound() -> None:
    r = router(1, max_queued_requests=2)
    assert r.admit()
    r.queued = 2
    assert not r.admit()
    assert router(1).admit()  # no bound


def test_avoid_skips_replicas_that_answered_busy_unless_nothing_else_is_left() -> None:
    r = router(2)
    r.set_loaded(0, ("m",))
    r.set_loaded(1, ("m",))
    assert {r.pick("m", RoutingContext(0.0), 0.0, avoid=[0]) for _ in range(20)} == {1}
    one = router(1)
    assert one.pick("m", RoutingContext(0.0), 0.0, avoid=[0]) == 0


def test_a_removed_replica_is_never_picked_and_its_models_are_forgotten() -> None:
    r = router(3)
    r.set_loaded(1, ("a",))
    r.remove(1)
    assert r.by_model["a"] == []
    assert all(r.pick("a", RoutingContext(0.0), 0.0) != 1 for _ in range(30))


# ------------------------------------------------------------------ autoscaling
CFG = AutoscalingSettings(
    min_replicas=1,
    max_replicas=10,
    target_ongoing_requests=2.0,
    upscale_delay_s=1.0,
    downscale_delay_s=3.0,
    interval_s=0.5,
)


def test_desired_replicas_follows_the_error_ratio_and_the_bounds() -> None:
    assert desired_replicas(CFG, 8.0, 2) == 4  # 2 per replica wanted, 4 each now
    assert desired_replicas(CFG, 4.0, 2) == 2
    assert desired_replicas(CFG, 1.0, 4) == 1
    assert desired_replicas(CFG, 0.0, 3) == 1  # ceil(0) clamped to min
    assert desired_replicas(CFG, 100.0, 2) == 10  # clamped to max
    halfway = AutoscalingSettings(max_replicas=10, upscaling_factor=0.5)
    assert desired_replicas(halfway, 8.0, 2) == 3  # half the way from 2 to 4
    with pytest.raises(ValueError):
        desired_replicas(CFG, 1.0, 0)


def test_upscale_waits_for_its_delay_and_a_neutral_tick_resets_the_count() -> None:
    a = Autoscaler(CFG, target=2)
    # upscale_delay 1 s / interval 0.5 s = 2: the third consecutive tick scales
    assert [a.decide(8.0, 2) for _ in range(3)] == [2, 2, 4]
    b = Autoscaler(CFG, target=2)
    assert b.decide(8.0, 2) == 2
    assert b.decide(4.0, 2) == 2  # neutral: counter back to 0
    assert [b.decide(8.0, 2) for _ in range(3)] == [2, 2, 4]


def test_downscale_waits_for_its_longer_delay() -> None:
    a = Autoscaler(CFG, target=4)
    got = [a.decide(2.0, 4) for _ in range(7)]  # 3 s / 0.5 s = 6: the seventh tick
    assert got == [4] * 6 + [1]


def test_from_zero_replicas_waiting_traffic_asks_for_one() -> None:
    a = Autoscaler(attrs_evolve_min0(), target=0)
    assert a.decide(0.0, 0) == 0
    assert a.decide(3.0, 0) == 1


def attrs_evolve_min0() -> AutoscalingSettings:
    import attrs

    return attrs.evolve(CFG, min_replicas=0)


def test_the_metric_is_averaged_over_the_look_back_window() -> None:
    a = Autoscaler(AutoscalingSettings(look_back_period_s=1.0), target=1)
    assert a.observe(0.0, 4.0) == 4.0
    assert a.observe(0.5, 0.0) == 2.0
    assert a.observe(2.0, 1.0) == 1.0  # the older samples left the window
