"""The shared weight cache: single flight, failed-load retry, refcounted release."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.events import Reason
from core.weights import (
    EntryState,
    Free,
    Hit,
    Loaded,
    LoadFailed,
    Refused,
    Released,
    StartLoad,
    Wait,
    WeightCache,
    WeightKey,
    Withdrawn,
)

K = WeightKey("joe.onnx", "numpy", "cpu")
K2 = WeightKey("joe.onnx", "cuda", "0")


class Handle:
    """Stands for uploaded weights; identity matters."""


def test_single_flight_then_hits() -> None:
    cache: WeightCache[Handle] = WeightCache()
    assert cache.acquire(K, "a") == StartLoad(K, "a")
    assert cache.acquire(K, "b") == Wait(K, "b")
    assert cache.acquire(K, "c") == Wait(K, "c")
    assert cache.loader(K) == "a"
    handle = Handle()
    loaded = cache.load_succeeded(K, handle)
    assert loaded == Loaded(K, handle, ("a", "b", "c"))
    assert cache.acquire(K, "d") == Hit(K, "d", handle)
    assert cache.refcount(K) == 4
    assert cache.state(K) is EntryState.READY


def test_keys_are_independent() -> None:
    cache: WeightCache[Handle] = WeightCache()
    assert isinstance(cache.acquire(K, "a"), StartLoad)
    assert isinstance(cache.acquire(K2, "a"), StartLoad)  # other device: its own upload
    assert cache.keys() == (K, K2)


def test_failed_load_fails_every_waiter_and_next_acquire_retries() -> None:
    cache: WeightCache[Handle] = WeightCache()
    cache.acquire(K, "a")
    cache.acquire(K, "b")
    failed = cache.load_failed(K, OSError("truncated file"))
    assert isinstance(failed, LoadFailed)
    assert failed.failed == ("a", "b")
    assert failed.reason is Reason.LOAD_FAILED
    assert "truncated file" in failed.message
    assert cache.state(K) is None
    assert cache.acquire(K, "b") == StartLoad(K, "b")  # retry starts a fresh load
    handle = Handle()
    assert cache.load_succeeded(K, handle) == Loaded(K, handle, ("b",))


def test_last_release_frees_and_only_then() -> None:
    cache: WeightCache[Handle] = WeightCache()
    handle = Handle()
    cache.acquire(K, "a")
    cache.acquire(K, "b")
    cache.load_succeeded(K, handle)
    assert cache.release(K, "a") == Released(K, "a", 1)
    assert cache.handle(K) is handle
    freed = cache.release(K, "b")
    assert freed == Free(K, handle)
    assert isinstance(freed, Free) and freed.handle is handle
    assert cache.state(K) is None and cache.refcount(K) == 0


def test_loader_reacquires_after_its_release() -> None:
    cache: WeightCache[Handle] = WeightCache()
    handle = Handle()
    cache.acquire(K, "a")
    cache.load_succeeded(K, handle)
    cache.acquire(K, "b")
    cache.release(K, "a")
    assert cache.acquire(K, "a") == Hit(K, "a", handle)  # found by the state machine


def test_double_release_and_double_acquire_are_refused_values() -> None:
    cache: WeightCache[Handle] = WeightCache()
    handle = Handle()
    cache.acquire(K, "a")
    cache.acquire(K, "b")
    dup = cache.acquire(K, "b")
    assert isinstance(dup, Refused) and dup.reason is Reason.WEIGHTS_ALREADY_HELD
    cache.load_succeeded(K, handle)
    dup = cache.acquire(K, "a")
    assert isinstance(dup, Refused) and dup.reason is Reason.WEIGHTS_ALREADY_HELD
    cache.release(K, "a")
    again = cache.release(K, "a")
    assert isinstance(again, Refused) and again.reason is Reason.WEIGHTS_NOT_HELD
    assert "double release" in again.message
    assert cache.refcount(K) == 1  # the refused call changed nothing
    assert isinstance(cache.release(K, "b"), Free)
    gone = cache.release(K, "b")
    assert isinstance(gone, Refused) and gone.reason is Reason.WEIGHTS_NOT_HELD


def test_waiter_can_withdraw_loader_cannot_release_mid_load() -> None:
    cache: WeightCache[Handle] = WeightCache()
    cache.acquire(K, "a")
    cache.acquire(K, "b")
    assert cache.release(K, "b") == Withdrawn(K, "b")
    early = cache.release(K, "a")
    assert isinstance(early, Refused) and early.reason is Reason.INVALID_STATE
    handle = Handle()
    assert cache.load_succeeded(K, handle) == Loaded(K, handle, ("a",))


def test_reports_without_a_load_in_flight_are_refused() -> None:
    cache: WeightCache[Handle] = WeightCache()
    assert isinstance(cache.load_succeeded(K, Handle()), Refused)
    assert isinstance(cache.load_failed(K, "boom"), Refused)
    cache.acquire(K, "a")
    cache.load_succeeded(K, Handle())
    late = cache.load_failed(K, "late")
    assert isinstance(late, Refused) and late.reason is Reason.INVALID_STATE
    assert cache.refcount(K) == 1


USERS = st.sampled_from(("u0", "u1", "u2", "u3"))
KEYS = st.sampled_from((K, K2))


class WeightCacheMachine(RuleBasedStateMachine):
    """Random acquire/succeed/fail/release against a plain model of the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: WeightCache[Handle] = WeightCache()
        self.loading: dict[WeightKey, list[Hashable]] = {}  # loader first, then waiters
        self.holders: dict[WeightKey, list[Hashable]] = {}
        self.handles: dict[WeightKey, Handle] = {}
        self.freed: list[Handle] = []
        self.live: list[Handle] = []
        self.loads_started = 0

    @rule(key=KEYS, user=USERS)
    def acquire(self, key: WeightKey, user: str) -> None:
        decision = self.cache.acquire(key, user)
        if user in self.loading.get(key, ()) or user in self.holders.get(key, ()):
            assert isinstance(decision, Refused)
        elif key in self.loading:
            assert decision == Wait(key, user)
            self.loading[key].append(user)
        elif key in self.holders:
            assert decision == Hit(key, user, self.handles[key])
            self.holders[key].append(user)
        else:
            assert decision == StartLoad(key, user)
            self.loading[key] = [user]
            self.loads_started += 1

    @precondition(lambda self: bool(self.loading))
    @rule(data=st.data())
    def succeed(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.loading)))
        handle = Handle()
        decision = self.cache.load_succeeded(key, handle)
        assert decision == Loaded(key, handle, tuple(self.loading.pop(key)))
        self.holders[key] = list(decision.granted)
        self.handles[key] = handle
        self.live.append(handle)

    @precondition(lambda self: bool(self.loading))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.loading)))
        decision = self.cache.load_failed(key, "boom")
        assert isinstance(decision, LoadFailed)
        assert decision.failed == tuple(self.loading.pop(key))

    @rule(key=KEYS, user=USERS)
    def release(self, key: WeightKey, user: str) -> None:
        decision = self.cache.release(key, user)
        holders = self.holders.get(key, [])
        loading = self.loading.get(key, [])
        if user in holders:
            holders.remove(user)
            if holders:
                assert decision == Released(key, user, len(holders))
            else:
                handle = self.handles.pop(key)
                del self.holders[key]
                assert isinstance(decision, Free) and decision.handle is handle
                assert handle not in self.freed  # freed exactly once
                self.freed.append(handle)
                self.live.remove(handle)
        elif user in loading[1:]:
            loading.remove(user)
            assert decision == Withdrawn(key, user)
        else:
            assert isinstance(decision, Refused)

    @invariant()
    def refcounts_and_single_flight_match(self) -> None:
        for key in (K, K2):
            assert self.cache.refcount(key) == len(self.holders.get(key, []))
            if key in self.loading:
                assert self.cache.state(key) is EntryState.LOADING
                assert self.cache.loader(key) == self.loading[key][0]
                assert self.cache.waiters(key) == tuple(self.loading[key][1:])
            handle = self.cache.handle(key)
            if handle is not None:
                assert handle not in self.freed  # never referenced after being freed
                assert self.cache.refcount(key) > 0
        assert len(self.live) == len(self.handles)


WeightCacheMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestWeightCacheMachine = WeightCacheMachine.TestCase
