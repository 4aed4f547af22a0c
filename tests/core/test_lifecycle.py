"""Core-level cases of the lifecycle catalogue (reference §7.2, §8.4, §8.7, §8.10).

The C++ suite drives a real server with gated fake models; the decisions it
pins down are made here, so each case is replayed on the core state machines
with explicit tickets and times. The async versions live in the runtime and
simulator tests.
"""

from __future__ import annotations

import pytest

from core.admission import Granted, Queued
from core.bulk import BulkDone, BulkUnload, UnloadNow, WaitForGrant
from core.entry import ModelEntry
from core.events import Reason
from core.invariants import check_quiescent, check_registry
from core.lifecycle import (
    Lifecycle,
    LifecycleError,
    ModelState,
    Nothing,
    Proceed,
    StartLoad,
    Teardown,
    WaitLoad,
)
from core.policy import Invalid, validate_slots
from core.recorder import Core
from core.registry import Existing, Registered, Registry
from core.residency import ResidencyLimits, RoomDecision, retire_idle


def add(
    reg: Registry, model_id: str, slots: int = 1, now: float = 0.0, memory: int = 0
) -> ModelEntry:
    """Register ``model_id`` (lazy) and release the registration lease at once."""
    r = reg.register(model_id, slots=slots, now=now, memory_bytes=memory)
    assert isinstance(r, Registered)
    r.entry.admission.release(r.lease.ticket, now)
    return r.entry


def warm(reg: Registry, entry: ModelEntry, now: float = 0.0) -> None:
    """Run one request to completion on ``entry``, loading it if needed."""
    t = reg.new_ticket()
    assert isinstance(entry.admission.request(t, now, None), Granted)
    d = reg.ensure_loaded(entry, t, now)
    if isinstance(d, RoomDecision):
        for ev in d.evictions:
            victim = reg.get(ev.model)
            assert victim is not None
            victim.lifecycle.unload_finished()
            victim.admission.release(ev.lease.ticket, now)
        assert d.load is not None
        entry.lifecycle.load_succeeded(t)
    else:
        assert isinstance(d, Proceed)
    entry.admission.release(t, now)


def test_first_load_has_one_initializer_and_publishes_complete_pool() -> None:
    reg = Registry()
    m = add(reg, "m", slots=4)
    tickets = [reg.new_ticket() for _ in range(4)]
    decisions = []
    for t in tickets:
        assert isinstance(m.admission.request(t, 0.0, None), Granted)
        decisions.append(reg.ensure_loaded(m, t, 0.0))
    assert isinstance(decisions[0], RoomDecision) and decisions[0].load == StartLoad(tickets[0], 0)
    assert all(isinstance(d, WaitLoad) and d.initializer == tickets[0] for d in decisions[1:])
    assert not m.lifecycle.loaded, "status must never expose a partial pool"
    outcome = m.lifecycle.load_succeeded(tickets[0])
    assert outcome.published and outcome.proceed == tuple(tickets[1:])
    assert m.lifecycle.loads_started == 1 and m.lifecycle.loads_published == 1
    assert not check_registry(reg, 0.0)


def test_load_failure_returns_to_unloaded_and_next_waiter_retries() -> None:
    life = Lifecycle("m")
    assert isinstance(life.ensure_loaded(1), StartLoad)
    assert isinstance(life.ensure_loaded(2), WaitLoad)
    assert isinstance(life.ensure_loaded(3), WaitLoad)
    outcome = life.load_failed(1)
    assert not outcome.published and outcome.retry == StartLoad(2, 0)
    assert life.state is ModelState.LOADING and life.initializer == 2
    assert life.load_failed(2).retry == StartLoad(3, 0)
    assert life.load_failed(3).retry is None
    assert life.state is ModelState.UNLOADED
    # a later request may retry and succeed
    assert isinstance(life.ensure_loaded(4), StartLoad)
    life.load_succeeded(4)
    assert life.loaded


def test_disconnected_load_waiter_is_forgotten() -> None:
    life = Lifecycle("m")
    life.ensure_loaded(1)
    life.ensure_loaded(2)
    assert life.abandon_wait(2)
    assert life.load_succeeded(1).proceed == ()


def test_invalid_reconfiguration_preserves_live_state() -> None:
    reg = Registry()
    m = add(reg, "m", slots=2)
    warm(reg, m)
    t = reg.new_ticket()
    assert isinstance(m.admission.manage(t, 1.0, None), Granted)
    m.lifecycle.begin_reconfigure()
    m.lifecycle.reject_reconfigure()  # e.g. task 'invalid_task' failed validation
    m.admission.release(t, 1.0)
    assert m.lifecycle.state is ModelState.READY and m.lifecycle.teardowns == 0
    warm(reg, m, 2.0)
    assert m.lifecycle.loads_started == 1


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_unsupported_capacity_preserves_registration(slots: int) -> None:
    reg = Registry()
    m = add(reg, "m", slots=slots)
    warm(reg, m)
    generation = m.admission.generation
    t = reg.new_ticket()
    m.admission.manage(t, 1.0, None)
    m.lifecycle.begin_reconfigure()
    check = validate_slots(5, capacity=4)
    assert isinstance(check, Invalid) and "capacity=4" in check.message
    m.lifecycle.reject_reconfigure()
    m.admission.release(t, 1.0)
    s = m.admission.state()
    assert (s.slots, s.active, s.queued_management, s.generation) == (slots, 0, 0, generation)
    assert m.lifecycle.loaded and m.lifecycle.teardowns == 0
    warm(reg, m, 2.0)


def test_dynamic_capacity_changes_use_parallel_lifecycle() -> None:
    reg = Registry()
    m = add(reg, "m", slots=1)
    warm(reg, m)
    for now, slots in enumerate([2, 1, 4, 1], start=1):
        t = reg.new_ticket()
        assert isinstance(m.admission.manage(t, float(now), None), Granted)
        m.lifecycle.begin_reconfigure()
        assert isinstance(m.commit_reconfigure(slots), Teardown)
        m.lifecycle.unload_finished()
        d = reg.ensure_loaded(m, t, float(now))
        assert isinstance(d, RoomDecision) and d.load is not None
        m.lifecycle.load_succeeded(t)
        m.admission.release(t, float(now))
        assert m.admission.state().slots == slots
        assert m.lifecycle.pool_generation == m.admission.generation == now
        warm(reg, m, float(now) + 0.5)
    assert not check_registry(reg, 10.0) and not check_quiescent(reg)


@pytest.mark.parametrize("slots", [1, 2, 4])
@pytest.mark.parametrize("reconfigure", [False, True])
def test_older_work_before_management(slots: int, reconfigure: bool) -> None:
    reg = Registry()
    m = add(reg, "shared", slots=slots)
    warm(reg, m)
    running = [reg.new_ticket() for _ in range(slots)]
    for t in running:
        assert isinstance(m.admission.request(t, 1.0, None), Granted)
    older = reg.new_ticket()
    assert isinstance(m.admission.request(older, 1.0, None), Queued)
    manager = reg.new_ticket()
    assert isinstance(m.admission.manage(manager, 1.0, None), Queued)
    later = reg.new_ticket()
    assert isinstance(m.admission.request(later, 1.0, None), Queued)
    wake = m.admission.release(running[0], 2.0).wakeups
    assert [lease.ticket for lease in wake.granted] == [older]
    assert wake.granted[0].generation == 0, "the older request binds the old configuration"
    assert isinstance(reg.ensure_loaded(m, older, 2.0), Proceed), "no reload of the old model"
    for t in [*running[1:], older]:
        wake = m.admission.release(t, 3.0).wakeups
    assert [lease.ticket for lease in wake.granted] == [manager]
    if reconfigure:
        m.lifecycle.begin_reconfigure()
        m.commit_reconfigure(slots)
        m.lifecycle.unload_finished()
        reg.ensure_loaded(m, manager, 3.0)
        m.lifecycle.load_succeeded(manager)
    else:
        assert isinstance(m.lifecycle.begin_unload(), Teardown)
        m.lifecycle.unload_finished()
    wake = m.admission.release(manager, 4.0).wakeups
    assert [lease.ticket for lease in wake.granted] == [later]
    assert wake.granted[0].generation == (1 if reconfigure else 0)
    assert m.lifecycle.loads_started == (2 if reconfigure else 1)
    assert m.lifecycle.resident is reconfigure
    m.admission.release(later, 5.0)
    assert not check_quiescent(reg)


def test_overlapping_managers_run_in_arrival_order() -> None:
    reg = Registry()
    m = add(reg, "m", slots=2)
    warm(reg, m)
    run = reg.new_ticket()
    m.admission.request(run, 1.0, None)
    first, last = reg.new_ticket(), reg.new_ticket()
    m.admission.manage(first, 1.0, None)
    m.admission.manage(last, 1.0, None)
    assert m.admission.state().queued_management == 2
    order = []
    wake = m.admission.release(run, 2.0).wakeups
    order += [lease.ticket for lease in wake.granted]
    m.lifecycle.begin_reconfigure()
    assert isinstance(m.commit_reconfigure(2, config="first"), Teardown)
    m.lifecycle.unload_finished()
    wake = m.admission.release(first, 3.0).wakeups
    order += [lease.ticket for lease in wake.granted]
    m.lifecycle.begin_reconfigure()
    m.commit_reconfigure(2, config="last")
    m.admission.release(last, 4.0)
    assert order == [first, last]
    assert m.config == "last"


def test_unload_of_unloaded_model_is_idempotent() -> None:
    life = Lifecycle("m")
    assert life.begin_unload() == Nothing(Reason.ALREADY_UNLOADED)


def test_unload_cannot_skip_a_load_in_progress() -> None:
    reg = Registry()
    m = add(reg, "m")
    t = reg.new_ticket()
    m.admission.request(t, 0.0, None)
    reg.ensure_loaded(m, t, 0.0)
    unload = reg.new_ticket()
    assert isinstance(m.admission.manage(unload, 0.0, None), Queued), (
        "the loading request holds a slot"
    )
    m.lifecycle.load_succeeded(t)
    wake = m.admission.release(t, 1.0).wakeups
    assert [lease.ticket for lease in wake.granted] == [unload]
    assert isinstance(m.lifecycle.begin_unload(), Teardown)


@pytest.mark.parametrize("hold_metadata", [False, True])
def test_bulk_releases_idle_first(hold_metadata: bool) -> None:
    reg = Registry()
    slow = add(reg, "slow")
    idle = add(reg, "idle")
    warm(reg, idle)
    cold = reg.new_ticket()
    slow.admission.request(cold, 1.0, None)
    reg.ensure_loaded(slow, cold, 1.0)  # slow's first load is in flight
    bulk = BulkUnload.publish(reg, None, 1.5)
    action = bulk.next_action()
    assert action == UnloadNow("idle", bulk.tickets["idle"]), "the ready idle model is freed first"
    assert isinstance(idle.lifecycle.begin_unload(), Teardown)
    idle.lifecycle.unload_finished()
    idle.admission.release(bulk.tickets["idle"], 1.6)
    bulk.finished("idle")
    assert bulk.next_action() == WaitForGrant(("slow",))
    # reads never wait on the slow model
    assert reg.status(slow).state == "loading" and not reg.status(slow).loaded
    slow.lifecycle.load_succeeded(cold)
    wake = slow.admission.release(cold, 2.0).wakeups
    assert wake.granted[0].ticket == bulk.tickets["slow"]
    bulk.granted("slow")
    assert bulk.next_action() == UnloadNow("slow", bulk.tickets["slow"])
    slow.lifecycle.begin_unload()
    slow.lifecycle.unload_finished()
    slow.admission.release(bulk.tickets["slow"], 2.1)
    bulk.finished("slow")
    assert bulk.next_action() == BulkDone(("slow", "idle"), ())
    assert bulk.order_violation() is None
    assert not check_quiescent(reg)


def test_overlapping_bulk_operations_publish_one_barrier_each() -> None:
    reg = Registry()
    a, b, unrelated = add(reg, "a"), add(reg, "b"), add(reg, "unrelated")
    for e in (a, b, unrelated):
        warm(reg, e)
    ra, rb = reg.new_ticket(), reg.new_ticket()
    a.admission.request(ra, 1.0, None)
    b.admission.request(rb, 1.0, None)
    first = BulkUnload.publish(reg, ["a", "b", "a"], 1.0)
    assert a.admission.state().queued_management == 1 and b.admission.state().queued_management == 1
    second = BulkUnload.publish(reg, ["b", "a"], 1.0)
    assert a.admission.state().queued_management == 2 and b.admission.state().queued_management == 2
    warm(reg, unrelated, 1.1)  # unrelated work is not blocked
    # on every shared model the first call's barrier is ahead of the second's: no circular wait
    for entry, run in ((a, ra), (b, rb)):
        wake = entry.admission.release(run, 2.0).wakeups
        assert wake.granted[0].ticket == first.tickets[entry.id]
    assert first.selected == ("a", "b") and second.selected == ("b", "a")


def test_bulk_unknown_ids_are_reported_and_duplicates_drained_once() -> None:
    reg = Registry()
    add(reg, "a")
    bulk = BulkUnload.publish(reg, ["a", "nope", "a", "nope"], 0.0)
    assert bulk.selected == ("a",) and bulk.not_found == ("nope",)
    assert bulk.next_action() == UnloadNow("a", bulk.tickets["a"])


@pytest.mark.parametrize("limit", [1, 2])
def test_retiring_resident_does_not_count(limit: int) -> None:
    reg = Registry(ResidencyLimits(max_loaded_models=limit))
    retiring, keeper, incoming = add(reg, "retiring"), add(reg, "keeper"), add(reg, "incoming")
    warm(reg, retiring)
    if limit == 2:
        warm(reg, keeper)
    manager = reg.new_ticket()
    retiring.admission.manage(manager, 1.0, None)
    assert isinstance(retiring.lifecycle.begin_unload(), Teardown)
    assert not retiring.resident and not retiring.lifecycle.loaded
    # teardown still in progress: the incoming load proceeds and evicts nobody
    t = reg.new_ticket()
    incoming.admission.request(t, 1.1, None)
    d = reg.ensure_loaded(incoming, t, 1.1)
    assert isinstance(d, RoomDecision) and d.load is not None and d.evictions == ()
    incoming.lifecycle.load_succeeded(t)
    if limit == 2:
        assert keeper.resident and keeper.lifecycle.teardowns == 0
    retiring.lifecycle.unload_finished()
    retiring.admission.release(manager, 1.2)
    incoming.admission.release(t, 1.2)
    assert not check_registry(reg, 2.0)


def test_eviction_takes_idle_lru_victim_and_refuses_when_all_busy() -> None:
    reg = Registry(ResidencyLimits(max_loaded_models=2))
    old, recent, cold, other = (
        add(reg, "old"),
        add(reg, "recent"),
        add(reg, "cold"),
        add(reg, "other"),
    )
    warm(reg, old, 1.0)
    warm(reg, recent, 2.0)
    t = reg.new_ticket()
    cold.admission.request(t, 3.0, None)
    d = reg.ensure_loaded(cold, t, 3.0)
    assert isinstance(d, RoomDecision) and [e.model for e in d.evictions] == ["old"]
    assert old.lifecycle.state is ModelState.UNLOADING
    old.lifecycle.unload_finished()
    old.admission.release(d.evictions[0].lease.ticket, 3.0)
    # now both residents are busy: a further cold load is refused and nothing is evicted
    busy = reg.new_ticket()
    recent.admission.request(busy, 3.5, None)
    t2 = reg.new_ticket()
    other.admission.request(t2, 4.0, None)
    d2 = reg.ensure_loaded(other, t2, 4.0)
    assert isinstance(d2, RoomDecision) and d2.refused is not None
    assert d2.refused[0] is Reason.RESIDENCY_LIMIT
    assert "max_loaded_models=2 and every loaded model is busy" in d2.refused[1]
    assert other.lifecycle.state is ModelState.UNLOADED and recent.resident and cold.resident
    assert not check_registry(reg, 4.0)


def test_memory_budget_counts_logical_residency() -> None:
    reg = Registry(ResidencyLimits(memory_budget=100))
    a, b = add(reg, "a", memory=60), add(reg, "b", memory=60)
    warm(reg, a)
    t = reg.new_ticket()
    b.admission.request(t, 1.0, None)
    d = reg.ensure_loaded(b, t, 1.0)
    assert isinstance(d, RoomDecision) and [e.model for e in d.evictions] == ["a"]


def test_a_model_over_the_whole_budget_is_refused_for_good() -> None:
    """A model whose own estimate exceeds the budget can never load: the refusal says so (no
    "retry later"), is marked ``never``, and evicts nothing; busy models still give the
    "retry later" refusal."""
    reg = Registry(ResidencyLimits(memory_budget=100))
    idle, huge = add(reg, "idle", memory=60), add(reg, "huge", memory=101)
    warm(reg, idle)
    t = reg.new_ticket()
    huge.admission.request(t, 1.0, None)
    d = reg.ensure_loaded(huge, t, 1.0)
    assert isinstance(d, RoomDecision) and d.refused is not None and d.never
    assert d.refused[0] is Reason.MEMORY_BUDGET and "retry" not in d.refused[1]
    assert "101 bytes exceeds the whole memory budget of 100 bytes" in d.refused[1]
    assert d.evictions == () and idle.resident and not huge.resident
    huge.admission.release(t, 1.5)
    fits = add(reg, "fits", memory=50)
    busy = reg.new_ticket()
    idle.admission.request(busy, 2.0, None)
    t2 = reg.new_ticket()
    fits.admission.request(t2, 2.0, None)
    d2 = reg.ensure_loaded(fits, t2, 2.0)
    assert isinstance(d2, RoomDecision) and d2.refused is not None and not d2.never
    assert "is used by busy models; retry later" in d2.refused[1]
    assert not check_registry(reg, 2.0)


def test_registration_is_visible_while_loading_and_duplicates_queue() -> None:
    reg = Registry(ResidencyLimits(max_loaded_models=1))
    other = add(reg, "other")
    r = reg.register("fresh", slots=2, now=0.0)
    assert isinstance(r, Registered)
    assert reg.get("fresh") is r.entry and len(reg.entries()) == 2
    d = reg.ensure_loaded(r.entry, r.lease.ticket, 0.0)
    assert isinstance(d, RoomDecision) and d.load is not None
    dup = reg.register("fresh", slots=2, now=0.1)
    assert isinstance(dup, Existing)
    t = reg.new_ticket()
    assert isinstance(dup.entry.admission.manage(t, 0.1, None), Queued)
    assert r.entry.admission.state().queued_management == 1
    r.entry.lifecycle.load_succeeded(r.lease.ticket)
    wake = r.entry.admission.release(r.lease.ticket, 0.2).wakeups
    assert [lease.ticket for lease in wake.granted] == [t]
    assert isinstance(reg.ensure_loaded(r.entry, t, 0.2), Proceed), "no second load"
    r.entry.admission.release(t, 0.3)
    # the new entry counts toward residency: loading 'other' evicts it
    warm(reg, other, 1.0)
    assert not r.entry.resident and other.resident


def test_idle_retirement_takes_only_idle_models_past_ttl() -> None:
    reg = Registry()
    idle, busy, fresh = add(reg, "idle"), add(reg, "busy"), add(reg, "fresh")
    warm(reg, idle, 0.0)
    warm(reg, busy, 0.0)
    warm(reg, fresh, 9.0)
    reg_t = reg.new_ticket()
    busy.admission.request(reg_t, 0.5, None)
    victims = retire_idle(reg, 10.0, idle_seconds=5.0)
    assert [v.model for v in victims] == ["idle"]
    assert retire_idle(reg, 10.0, idle_seconds=None) == ()


def test_lifecycle_rejects_illegal_transitions() -> None:
    life = Lifecycle("m")
    with pytest.raises(LifecycleError):
        life.unload_finished()
    with pytest.raises(LifecycleError):
        life.load_succeeded(1)
    life.ensure_loaded(1)
    with pytest.raises(LifecycleError):
        life.begin_reconfigure()


def test_original_runtime_bulk_unload_skips_unpublished_first_load() -> None:
    """Legacy bulk unload keeps upstream's unpublished-load skip (reference §1.5, seed 003 F2).

    The parallel runtime waits for a first load in progress (test_bulk_releases_idle_first);
    the original runtime's bulk unload skips a model whose first load is unpublished.
    """
    from core.policy import RuntimeKind

    reg = Registry(kind=RuntimeKind.ORIGINAL)
    slow, idle = add(reg, "slow"), add(reg, "idle")
    warm(reg, idle)
    cold = reg.new_ticket()
    assert isinstance(slow.admission.request(cold, 1.0, None), Granted)
    reg.ensure_loaded(slow, cold, 1.0)  # first load in flight, nothing published
    bulk = BulkUnload.publish(reg, None, 1.5)
    assert bulk.selected == ("idle",), "the unpublished first load is skipped, not waited for"
    assert slow.admission.state().queued_management == 0
    assert bulk.next_action() == UnloadNow("idle", bulk.tickets["idle"])


def _core_with(models: tuple[str, ...], limits: ResidencyLimits) -> Core:
    core = Core(limits)
    for model in models:
        registered = core.register(model, 1, 0, 0.0)
        assert isinstance(registered, Registered)
        core.release(model, registered.lease.ticket, 0.0)
    return core


def _start(core: Core, model: str, now: float) -> int:
    """A request lease on ``model`` at ``now`` (loading the model if it must)."""
    ticket = core.new_ticket(now)
    assert isinstance(core.request(model, ticket, now, None), Granted)
    d = core.ensure_loaded(model, ticket, now)
    if isinstance(d, RoomDecision):
        assert d.load is not None and not d.evictions
        core.load_succeeded(model, ticket, 1, now)
    return ticket


def test_lru_eviction_counts_from_the_end_of_the_last_use() -> None:
    """Race report 1: 'long' started first (t=1) but ran until t=10; 'short' ran 2-3.
    The least recently used model is the one whose last use *ended* first: 'short'."""
    core = _core_with(("long", "short", "cold"), ResidencyLimits(max_loaded_models=2))
    t_long = _start(core, "long", 1.0)
    core.release("short", _start(core, "short", 2.0), 3.0)
    core.release("long", t_long, 10.0)
    assert (core.entry("long").last_used, core.entry("short").last_used) == (10.0, 3.0)
    ticket = core.new_ticket(11.0)
    core.request("cold", ticket, 11.0, None)
    d = core.ensure_loaded("cold", ticket, 11.0)
    assert isinstance(d, RoomDecision) and [e.model for e in d.evictions] == ["short"]


def test_idle_retirement_counts_from_the_end_of_the_last_use() -> None:
    """Race report 1: with a 2 s TTL, a model whose 9 s run ended at t=10 is not idle at
    t=11.5 (it would be by its start time), and is at t=12."""
    core = _core_with(("long",), ResidencyLimits())
    core.release("long", _start(core, "long", 1.0), 10.0)
    assert core.retire_idle(11.5, 2.0) == ()
    assert [v.model for v in core.retire_idle(12.0, 2.0)] == ["long"]
