"""Session pool construction: port of audio.cpp's test_session_pool (reference §7.3)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.events import Reason
from core.pool import (
    CLONE_MISMATCH_MESSAGE,
    MAX_PARALLEL_SESSIONS,
    CreateClone,
    CreatePrimary,
    Interface,
    PoolBuilder,
    PoolBuildError,
    PoolProtocolError,
    Publish,
    Session,
    SessionFactory,
    Teardown,
    build_pool,
)

ALL = frozenset(Interface)
FAULTS = ("null", "raises", "family", "task", "mode", "no_batch")


class Weights:
    """Shared immutable weights; records whether it died before its sessions."""


class FakeSession:
    def __init__(
        self,
        factory: FakeFactory,
        family: str = "fixture",
        task: str = "tts",
        mode: str = "offline",
        interfaces: frozenset[Interface] = ALL,
    ) -> None:
        self._factory = factory
        self._family, self._task, self._mode = family, task, mode
        self._interfaces = interfaces
        self.weights = factory.weights
        self.calls = 0
        self.closed = 0

    @property
    def family(self) -> str:
        return self._family

    @property
    def task(self) -> str:
        return self._task

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def interfaces(self) -> frozenset[Interface]:
        return self._interfaces

    def run(self, request: Any) -> Any:
        self.calls += 1
        return f"{request}:{self.calls}"

    def stream(self, request: Any) -> Iterator[Any]:
        yield self.run(request)

    def batch(self, requests: Sequence[Any]) -> list[Any]:
        return [self.run(r) for r in requests]

    def reset(self) -> None:
        self.calls = 0

    def close(self) -> None:
        self.closed += 1
        self._factory.closed.append(self)


class FakeFactory:
    """A loaded model whose clone can fail on cue (``fault`` at clone ``fault_at``)."""

    def __init__(
        self,
        capacity: int = 4,
        fault: str | None = None,
        fault_at: int = 2,
        null_primary: bool = False,
        mode: str = "offline",
    ) -> None:
        self._capacity = capacity
        self.fault = fault
        self.fault_at = fault_at
        self.null_primary = null_primary
        self._mode = mode
        self.weights = Weights()
        self.created: list[FakeSession] = []
        self.closed: list[FakeSession] = []
        self.clone_attempts = 0

    @property
    def family(self) -> str:
        return "fixture"

    @property
    def task(self) -> str:
        return "tts"

    @property
    def mode(self) -> str:
        return self._mode

    def capacity(self) -> int:
        return self._capacity

    def create(self) -> Session:
        if self.null_primary:
            return None  # type: ignore[return-value]
        session = FakeSession(self, mode=self._mode)
        self.created.append(session)
        return session

    def clone(self, primary: Session) -> Session:
        self.clone_attempts += 1
        kwargs: dict[str, Any] = {"mode": self._mode}
        if self.clone_attempts == self.fault_at and self.fault is not None:
            if self.fault == "null":
                return None  # type: ignore[return-value]
            if self.fault == "raises":
                raise MemoryError("out of device memory")
            if self.fault == "family":
                kwargs["family"] = "other"
            elif self.fault == "task":
                kwargs["task"] = "asr"
            elif self.fault == "mode":
                kwargs["mode"] = "streaming"
            elif self.fault == "no_batch":
                kwargs["interfaces"] = ALL - {Interface.BATCH}
        session = FakeSession(self, **kwargs)
        self.created.append(session)
        return session


def test_fakes_satisfy_the_protocols() -> None:
    factory = FakeFactory()
    assert isinstance(factory, SessionFactory)
    assert isinstance(factory.create(), Session)


def test_capacity_one_allows_one_slot_only() -> None:
    pool = build_pool(FakeFactory(capacity=1), 1)
    assert (pool.size, pool.capacity) == (1, 1)
    assert pool.at(0) is pool.primary
    with pytest.raises(PoolBuildError) as err:
        build_pool(FakeFactory(capacity=1), 2)
    assert err.value.reason is Reason.CAPACITY_EXCEEDED
    assert err.value.message == (
        "model 'fixture' does not support the requested slots for this "
        "backend/task/mode (capacity=1)"
    )


def test_null_primary_rejected() -> None:
    with pytest.raises(PoolBuildError) as err:
        build_pool(FakeFactory(null_primary=True), 1)
    assert err.value.reason is Reason.CREATE_FAILED
    assert "null task session" in err.value.message


@pytest.mark.parametrize("count", [0, 17, -1, True, 2.0, "2", None])
def test_invalid_counts_rejected_before_any_session(count: Any) -> None:
    factory = FakeFactory(capacity=16)
    with pytest.raises(PoolBuildError) as err:
        build_pool(factory, count)
    assert err.value.reason is Reason.INVALID_SLOTS
    assert factory.created == []


def test_at_out_of_range_raises() -> None:
    pool = build_pool(FakeFactory(capacity=1), 1)
    with pytest.raises(IndexError):
        pool.at(1)
    with pytest.raises(IndexError):
        pool.at(-1)
    with pytest.raises(ValueError):
        pool.at(True)


@pytest.mark.parametrize("fault", FAULTS)
def test_clone_fault_rejects_after_two_attempts_and_closes_primary_last(fault: str) -> None:
    factory = FakeFactory(capacity=4, fault=fault)
    with pytest.raises(PoolBuildError) as err:
        build_pool(factory, 4)
    assert factory.clone_attempts == 2
    primary = factory.created[0]
    assert factory.closed[-1] is primary
    assert sorted(map(id, factory.closed)) == sorted(map(id, factory.created))
    assert all(s.closed == 1 for s in factory.created)
    if fault in ("null", "raises"):
        assert err.value.reason is Reason.CLONE_FAILED
        assert len(factory.created) == 2  # primary + the first clone
    else:
        assert err.value.reason is Reason.CLONE_MISMATCH
        assert err.value.message == CLONE_MISMATCH_MESSAGE
        assert len(factory.created) == 3  # the mismatched clone is closed too, first
        assert factory.closed[0] is factory.created[2]
    # Retry with the fault cleared succeeds; teardown again closes the primary last.
    factory.fault = None
    factory.closed.clear()
    pool = build_pool(factory, 4)
    assert pool.size == 4
    for session in pool.teardown_order():
        session.close()
    assert factory.closed[-1] is pool.primary
    assert factory.closed[:3] == [pool.clones[2], pool.clones[1], pool.clones[0]]


@pytest.mark.parametrize("capacity", [0, 1, 2])
def test_adapter_capacity_below_count_rejects_without_cloning(capacity: int) -> None:
    factory = FakeFactory(capacity=capacity)
    with pytest.raises(PoolBuildError) as err:
        build_pool(factory, 3)
    assert err.value.reason is Reason.CAPACITY_EXCEEDED
    assert f"(capacity={capacity})" in err.value.message
    assert factory.clone_attempts == 0
    assert factory.created == []


def test_capacity_is_capped_at_sixteen() -> None:
    builder = PoolBuilder("fixture", 4, 100)
    assert builder.capacity == MAX_PARALLEL_SESSIONS


def test_sessions_distinct_and_share_weights() -> None:
    factory = FakeFactory(capacity=4)
    pool = build_pool(factory, 4)
    assert len({id(s) for s in pool.sessions}) == 4
    assert all(s.weights is factory.weights for s in pool.sessions)  # type: ignore[attr-defined]
    # Per-session mutable state is independent: a native batch on each slot counts alone.
    for slot in range(pool.size):
        assert pool.at(slot).batch([slot, slot]) == [f"{slot}:1", f"{slot}:2"]


def test_streaming_primary_must_stream() -> None:
    builder = PoolBuilder("fixture", 1, 1)
    factory = FakeFactory(mode="streaming")
    primary = FakeSession(factory, mode="streaming", interfaces=frozenset({Interface.OFFLINE}))
    action = builder.primary_created(primary)
    assert isinstance(action, Teardown)
    assert action.sessions == (primary,)
    assert action.reason is Reason.CREATE_FAILED


def test_builder_steps_and_protocol_errors() -> None:
    factory = FakeFactory(capacity=3)
    builder = PoolBuilder.for_factory(factory, 3)
    assert builder.next_action() == CreatePrimary()
    with pytest.raises(PoolProtocolError):
        builder.clone_created(factory.create())
    factory.created.clear()
    primary = factory.create()
    assert builder.primary_created(primary) == CreateClone(1)
    assert builder.next_action() == CreateClone(1)  # asking twice is harmless
    assert builder.clone_created(factory.clone(primary)) == CreateClone(2)
    action = builder.clone_created(factory.clone(primary))
    assert isinstance(action, Publish)
    assert builder.next_action() is action
    assert action.pool.sessions == tuple(factory.created)
    with pytest.raises(PoolProtocolError):
        builder.clone_failed("late")


def test_primary_failure_closes_nothing() -> None:
    builder = PoolBuilder("fixture", 2, 2)
    action = builder.primary_failed(RuntimeError("no memory"))
    assert isinstance(action, Teardown)
    assert (action.sessions, action.reason) == ((), Reason.CREATE_FAILED)
    assert "no memory" in action.message


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(min_value=-1, max_value=18),
    capacity=st.integers(min_value=-1, max_value=20),
    fault=st.sampled_from((None, *FAULTS)),
    fault_at=st.integers(min_value=1, max_value=16),
)
def test_build_outcome_properties(
    count: int, capacity: int, fault: str | None, fault_at: int
) -> None:
    factory = FakeFactory(capacity=capacity, fault=fault, fault_at=fault_at)
    try:
        pool = build_pool(factory, count)
    except PoolBuildError:
        assert factory.closed == list(reversed(factory.created))  # clones newest first
        assert all(s.closed == 1 for s in factory.created)
        if factory.created:
            assert factory.closed[-1] is factory.created[0]
        valid = 1 <= count <= min(capacity, 16)
        assert not valid or (fault is not None and fault_at < count)
        return
    assert fault is None or fault_at >= count
    assert pool.size == count
    assert pool.capacity == min(capacity, MAX_PARALLEL_SESSIONS) >= count
    assert factory.closed == []
    assert factory.clone_attempts == count - 1
    first = pool.primary
    for s in pool.sessions:
        assert (s.family, s.task, s.mode, s.interfaces) == (
            first.family,
            first.task,
            first.mode,
            first.interfaces,
        )
