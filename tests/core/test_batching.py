"""Continuous-batching membership: reference §6 rules and the §6.5 defects as tests."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.batching import (
    MAX_AHEAD,
    WINDOW_SPAN,
    Ack,
    BatchScheduler,
    Chunk,
    Drained,
    EndOfStream,
    Failed,
    Finish,
    Idle,
    Ignored,
    Launched,
    NotReady,
    Outcome,
    Rejected,
    Released,
    SlotHandle,
    SlotState,
    StaleHandle,
    StepPlan,
    WaitUntil,
)
from core.events import Reason


def launch(s: BatchScheduler[str], rid: str, now: float = 0.0) -> SlotHandle:
    decision = s.launch(rid, now)
    assert isinstance(decision, Launched), decision
    return decision.handle


def plan(s: BatchScheduler[str], now: float = 1.0) -> StepPlan:
    decision = s.poll(now)
    assert isinstance(decision, StepPlan), decision
    return decision


def finish_member(s: BatchScheduler[str], h: SlotHandle, tail: str) -> None:
    """Stop ``h`` and carry out its finish decision with one tail chunk."""
    assert isinstance(s.member_finished(h), Ack)
    p = plan(s)
    assert [f.handle for f in p.finish] == [h]
    assert p.finish[0].emit_tail
    s.chunk_ready(h, tail)
    assert s.tail_done(h) == Ack(h, SlotState.FINISHED, Reason.MEMBER_STOPPED)


def test_launch_join_advance_and_stream_to_the_end() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.0)
    h = launch(s, "a")
    assert s.read(h) == NotReady(h)
    p = plan(s)
    assert (p.join, p.advance, p.finish) == ((h,), (h,), ())
    assert s.chunk_ready(h, "a1") == Ack(h, SlotState.ACTIVE, Reason.GRANTED)
    assert s.read(h) == Chunk(h, "a1")
    assert plan(s).advance == (h,)
    assert s.steps(h) == 2
    finish_member(s, h, "a-tail")
    assert s.read(h) == Chunk(h, "a-tail")
    assert s.read(h) == EndOfStream(h, Outcome.COMPLETED, Reason.MEMBER_STOPPED)
    assert s.poll(2.0) == Idle()
    assert s.release(h) == Released(h, Outcome.COMPLETED, 0)


def test_batch_full_rejects() -> None:
    s: BatchScheduler[str] = BatchScheduler(1)
    launch(s, "a")
    assert s.launch("b", 0.0) == Rejected("b")


# ---- reference §6.5 defects ------------------------------------------------


def test_defect_slot_not_reused_before_owner_drained() -> None:
    s: BatchScheduler[str] = BatchScheduler(1, window=0.0)
    a = launch(s, "a")
    plan(s)
    s.chunk_ready(a, "a1")
    finish_member(s, a, "a-tail")
    # Decoding ended but the owner has not drained: the slot is not free.
    assert s.state(a.slot) is SlotState.FINISHED
    assert s.free_slots() == ()
    assert isinstance(s.launch("b", 1.0), Rejected)
    assert s.drain(a) == Drained(a, ("a1", "a-tail"), ended=True)
    assert isinstance(s.release(a), Released)
    b = launch(s, "b", 1.0)
    assert b.slot == a.slot


def test_defect_epoch_survives_reset_and_stale_handle_never_reads() -> None:
    s: BatchScheduler[str] = BatchScheduler(1, window=0.0)
    a = launch(s, "a")
    plan(s)
    finish_member(s, a, "a-tail")
    assert s.read(a) == Chunk(a, "a-tail")
    assert isinstance(s.release(a), Released)
    b = launch(s, "b")
    assert b.slot == a.slot and b.epoch > a.epoch
    plan(s)
    s.chunk_ready(b, "b1")
    # The old owner reads again: end of its stream, never b's audio.
    assert s.read(a) == StaleHandle(a)
    assert s.drain(a) == StaleHandle(a)
    assert s.release(a) == StaleHandle(a)  # idempotent, b keeps its slot
    assert s.abort(a) == StaleHandle(a)
    assert s.chunk_ready(a, "x") == StaleHandle(a)
    assert s.read(b) == Chunk(b, "b1")


def test_defect_tail_decided_exactly_once() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.0)
    a = launch(s, "a")
    b = launch(s, "b")
    plan(s)
    s.member_finished(a)
    first = plan(s)
    assert first.finish == (Finish(a, emit_tail=True, reason=Reason.MEMBER_STOPPED),)
    assert first.advance == (b,)
    # Until tail_done, later plans never list it again.
    assert plan(s).finish == ()
    assert isinstance(s.member_finished(a), Ignored)
    assert s.tail_done(a) == Ack(a, SlotState.FINISHED, Reason.MEMBER_STOPPED)
    assert isinstance(s.tail_done(a), Ignored)  # a second tail is refused
    assert plan(s).finish == ()


# ---- release, abort, failure ---------------------------------------------------


def test_release_too_early_is_ignored() -> None:
    s: BatchScheduler[str] = BatchScheduler(1, window=0.0)
    a = launch(s, "a")
    early = s.release(a)
    assert isinstance(early, Ignored) and early.reason is Reason.SLOT_NOT_FINISHED
    plan(s)
    assert isinstance(s.release(a), Ignored)
    assert s.state(a.slot) is SlotState.ACTIVE


def test_abort_pending_frees_nothing_until_release() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=1.0)
    a = launch(s, "a")
    assert s.abort(a) == Ack(a, SlotState.FINISHED, Reason.CANCELLED)
    assert s.pending() == ()
    assert s.read(a) == EndOfStream(a, Outcome.ABORTED, Reason.CANCELLED)
    assert s.poll(0.0) == Idle()
    assert s.release(a) == Released(a, Outcome.ABORTED, 0)


def test_abort_active_finishes_without_tail() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.0)
    a = launch(s, "a")
    plan(s)
    s.chunk_ready(a, "a1")
    assert s.abort(a) == Ack(a, SlotState.STOPPED, Reason.CANCELLED)
    assert isinstance(s.abort(a), Ignored)
    p = plan(s)
    assert p.finish == (Finish(a, emit_tail=False, reason=Reason.CANCELLED),)
    assert p.advance == ()
    s.tail_done(a)
    assert s.read(a) == Chunk(a, "a1")
    assert s.read(a) == EndOfStream(a, Outcome.ABORTED, Reason.CANCELLED)
    assert s.release(a) == Released(a, Outcome.ABORTED, 0)


def test_member_failure_is_sticky_until_release() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.0)
    a = launch(s, "a")
    plan(s)
    s.chunk_ready(a, "a1")
    assert s.member_failed(a, "prefill longer than 1024 steps") == Ack(
        a, SlotState.FINISHED, Reason.MEMBER_FAILED
    )
    assert s.read(a) == Failed(a, "prefill longer than 1024 steps")
    assert s.read(a) == Failed(a, "prefill longer than 1024 steps")
    assert s.poll(1.0) == Idle()
    assert s.release(a) == Released(a, Outcome.FAILED, 1)


def test_max_steps_stops_member() -> None:
    s: BatchScheduler[str] = BatchScheduler(1, window=0.0, max_steps=3)
    a = launch(s, "a")
    for _ in range(3):
        assert plan(s).advance == (a,)
    p = plan(s)
    assert p.advance == () and p.finish == (Finish(a, True, Reason.MAX_STEPS),)
    s.tail_done(a)
    assert s.read(a) == EndOfStream(a, Outcome.COMPLETED, Reason.MAX_STEPS)


# ---- join policies and the collection window -----------------------------------


def test_collection_window_starts_simultaneous_arrivals_together() -> None:
    s: BatchScheduler[str] = BatchScheduler(3, window=0.008)
    a = launch(s, "a", 0.0)
    assert s.poll(0.0) == WaitUntil(0.008)  # a request alone waits one window
    b = launch(s, "b", 0.004)
    assert s.poll(0.004) == WaitUntil(0.012)  # a window after the latest arrival
    assert s.poll(0.011) == WaitUntil(0.012)
    p = plan(s, 0.012)
    assert p.join == (a, b) and p.advance == (a, b)


def test_a_burst_of_arrivals_is_collected_for_at_most_the_window_span() -> None:
    """Arrivals a little apart keep the window open, but not past WINDOW_SPAN windows from
    the first: a steady trickle cannot hold the batch back."""
    s: BatchScheduler[str] = BatchScheduler(100, window=0.008)
    handles = [launch(s, "0", 0.0)]
    for i in range(1, 7):  # every 6 ms, the last at 36 ms
        handles.append(launch(s, str(i), 0.006 * i))
        assert s.poll(0.006 * i) == WaitUntil(min(0.006 * i + 0.008, WINDOW_SPAN * 0.008))
    p = plan(s, WINDOW_SPAN * 0.008)
    assert p.join == tuple(handles)


def test_full_pending_starts_at_once() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.008)
    a = launch(s, "a", 0.0)
    b = launch(s, "b", 0.0)
    assert plan(s, 0.0).join == (a, b)


@pytest.mark.parametrize("continuous", [True, False])
def test_join_policy(continuous: bool) -> None:
    s: BatchScheduler[str] = BatchScheduler(3, window=0.008, join_between_steps=continuous)
    a = launch(s, "a", 0.0)
    assert plan(s, 0.01).join == (a,)
    b = launch(s, "b", 0.02)
    p = plan(s, 0.02)  # a batch is running: no collection window either way
    if continuous:
        assert p.join == (b,) and p.advance == (a, b)
        return
    assert p.join == () and p.advance == (a,)
    assert (p.waiting, p.reason) == (1, Reason.ROUND_RUNNING)
    s.member_finished(a)
    p = plan(s, 0.03)  # round drained: a finishes, b starts the next round now
    assert [f.handle for f in p.finish] == [a]
    assert p.join == (b,) and p.advance == (b,)


def test_finishes_are_not_delayed_by_the_window() -> None:
    s: BatchScheduler[str] = BatchScheduler(3, window=0.008)
    a = launch(s, "a", 0.0)
    plan(s, 0.0 + 0.008)
    s.member_finished(a)
    b = launch(s, "b", 0.1)
    p = plan(s, 0.1)
    assert [f.handle for f in p.finish] == [a]
    assert (p.join, p.waiting, p.reason) == ((), 1, Reason.COLLECTION_WINDOW)
    s.tail_done(a)
    wait = s.poll(0.1)
    assert isinstance(wait, WaitUntil) and wait.deadline == pytest.approx(0.108)
    assert plan(s, wait.deadline).join == (b,)


def test_released_slots_are_reused_fifo() -> None:
    s: BatchScheduler[str] = BatchScheduler(3, window=0.0)
    hs = [launch(s, r) for r in "abc"]
    plan(s)
    for h in (hs[2], hs[0]):
        s.abort(h)
    plan(s)
    for h in (hs[2], hs[0]):
        s.tail_done(h)
        s.release(h)
    assert s.free_slots() == (2, 0)
    assert launch(s, "d").slot == 2
    assert launch(s, "e").slot == 0


# ---- property: random owners and driver against a model ----------------------


class BatchingMachine(RuleBasedStateMachine):
    """Random launches, plans, chunks, stops, aborts, reads and releases."""

    @initialize(max_batch=st.integers(1, 3), continuous=st.booleans())
    def setup(self, max_batch: int, continuous: bool) -> None:
        self.s: BatchScheduler[tuple[Hashable, int]] = BatchScheduler(
            max_batch, window=0.01, join_between_steps=continuous, max_ahead=2
        )
        self.deliveries = 0  # engine calls (step_chunks)
        self.since: dict[int, int] = {}  # chunks wait since (delivery), per request
        self.now = 0.0
        self.next_id = 0
        self.free = list(range(max_batch))
        self.live: dict[int, SlotHandle] = {}  # request -> handle, until released
        self.sent: dict[int, int] = {}  # chunks queued per request
        self.read_n: dict[int, int] = {}  # chunks read per request
        self.outcome: dict[int, Outcome] = {}
        self.stale: list[SlotHandle] = []
        self.finishing: set[SlotHandle] = set()
        self.finished_once: set[SlotHandle] = set()

    def rid(self, h: SlotHandle) -> int:
        request = self.s.request_of(h)
        assert isinstance(request, int)
        return request

    @rule(dt=st.sampled_from((0.0, 0.004, 0.02)))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def launch(self) -> None:
        rid, self.next_id = self.next_id, self.next_id + 1
        decision = self.s.launch(rid, self.now)
        if not self.free:
            assert decision == Rejected(rid)
            return
        assert isinstance(decision, Launched)
        assert decision.handle.slot == self.free.pop(0)  # FIFO reuse
        self.live[rid] = decision.handle
        self.sent[rid] = self.read_n[rid] = 0

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        decision = self.s.poll(self.now)
        if isinstance(decision, WaitUntil):
            assert decision.deadline > self.now
            return
        if isinstance(decision, Idle):
            return
        live = set(self.live.values())
        assert set(decision.join) <= live and set(decision.advance) <= live
        for f in decision.finish:
            assert f.handle not in self.finished_once  # each tail decided once
            self.finished_once.add(f.handle)
        deliveries: list[tuple[SlotHandle, list[tuple[Hashable, int]]]] = []
        self.deliveries += 1
        for h in decision.advance:
            action = data.draw(st.sampled_from(("chunk", "chunk", "stop", "fail", "none")))
            if action == "chunk":
                rid = self.rid(h)
                deliveries.append((h, [(rid, self.sent[rid])]))
                self._queued(rid)
            elif action == "stop":
                assert isinstance(self.s.member_finished(h), Ack)
            elif action == "fail":
                assert isinstance(self.s.member_failed(h, "boom"), Ack)
        assert self.s.step_chunks(deliveries) == []  # one engine call, every member decoding
        for f in decision.finish:
            if f.emit_tail:
                rid = self.rid(f.handle)
                self.s.chunk_ready(f.handle, (rid, self.sent[rid]))
                self._queued(rid)
            assert isinstance(self.s.tail_done(f.handle), Ack)

    def _queued(self, rid: int) -> None:
        if self.sent[rid] == self.read_n[rid]:  # the first chunk to wait
            self.since[rid] = self.deliveries
        self.sent[rid] += 1

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        h = self.live[rid]
        got = self.s.read(h)
        if isinstance(got, Chunk):
            assert got.data == (rid, self.read_n[rid])  # own data, in order
            self.read_n[rid] += 1
            self.since[rid] = self.deliveries  # the owner read (the rest waits from now)
        elif isinstance(got, EndOfStream):
            assert self.read_n[rid] == self.sent[rid]
            self.outcome[rid] = got.outcome
        elif isinstance(got, Failed):
            self.outcome[rid] = Outcome.FAILED
        else:
            assert isinstance(got, NotReady)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def drain(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        got = self.s.drain(self.live[rid])
        assert isinstance(got, Drained)
        assert got.chunks == tuple((rid, i) for i in range(self.read_n[rid], self.sent[rid]))
        self.read_n[rid] = self.sent[rid]  # every queued chunk taken: nothing waits

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        assert not isinstance(self.s.abort(self.live[rid]), StaleHandle)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        h = self.live[rid]
        finished = self.s.state(h.slot) is SlotState.FINISHED
        decision = self.s.release(h)
        if not finished:
            assert isinstance(decision, Ignored)
            return
        assert isinstance(decision, Released)
        self.outcome.setdefault(rid, decision.outcome)
        del self.live[rid]
        self.stale.append(h)
        self.free.append(h.slot)

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def stale_handle(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.stale))
        assert self.s.read(h) == StaleHandle(h)
        assert self.s.release(h) == StaleHandle(h)
        assert self.s.chunk_ready(h, ("x", 0)) == StaleHandle(h)

    @invariant()
    def one_live_handle_per_slot(self) -> None:
        if not hasattr(self, "s"):
            return
        slots = [h.slot for h in self.live.values()]
        assert len(slots) == len(set(slots))
        for h in self.live.values():
            assert self.s.handle_of(h.slot) == h
        assert sorted(self.s.free_slots()) == sorted(self.free)
        assert list(self.s.free_slots()) == self.free

    @invariant()
    def held_when_the_owner_did_not_read_for_max_ahead_calls(self) -> None:
        if not hasattr(self, "s"):
            return
        for rid, h in self.live.items():
            waiting = self.sent[rid] > self.read_n[rid]
            expected = waiting and self.deliveries - self.since[rid] >= 2
            assert self.s.held(h.slot) == expected, (rid, self.deliveries, self.since)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for h in self.live.values():
            self.s.abort(h)
        for _ in range(4):
            decision = self.s.poll(self.now + 1.0)
            if isinstance(decision, StepPlan):
                for f in decision.finish:
                    assert not f.emit_tail or f.reason is not Reason.CANCELLED
                    self.s.tail_done(f.handle)
                for h in decision.advance:
                    self.s.abort(h)
        for rid, h in self.live.items():
            assert self.s.state(h.slot) is SlotState.FINISHED
            released = self.s.release(h)
            assert isinstance(released, Released)
            self.outcome.setdefault(rid, released.outcome)
        # Every launched request ended: completed, aborted or failed.
        assert set(self.outcome) == set(self.sent)
        assert sorted(self.s.free_slots()) == list(range(self.s.max_batch))


BatchingMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestBatchingMachine = BatchingMachine.TestCase


def test_chunks_ready_queues_several_chunks_with_one_decision() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.0)
    a = launch(s, "a")
    assert isinstance(s.chunks_ready(a, ("early",)), Ignored)  # pending: not decoding yet
    plan(s)
    assert s.chunks_ready(a, ("a1", "a2")) == Ack(a, SlotState.ACTIVE, Reason.GRANTED)
    assert s.drain(a) == Drained(a, ("a1", "a2"), ended=False)
    finish_member(s, a, "a-tail")
    assert isinstance(s.chunks_ready(a, ("late",)), Ignored)  # finished: nothing queued
    assert s.drain(a) == Drained(a, ("a-tail",), ended=True)
    assert s.release(a) == Released(a, Outcome.COMPLETED, 0)
    assert s.chunks_ready(a, ("x",)) == StaleHandle(a)


def test_plans_share_one_advance_tuple_until_membership_changes() -> None:
    s: BatchScheduler[str] = BatchScheduler(4, window=0.0)
    a, b = launch(s, "a"), launch(s, "b")
    first = plan(s)
    assert plan(s).advance is plan(s).advance == first.advance == (a, b)
    c = launch(s, "c")
    assert plan(s).advance == (a, b, c)
    s.member_finished(b)
    assert plan(s).advance == (a, c)
    assert s.handle_of(a.slot) is a  # one handle object per member
    assert (s.steps(a), s.steps(b), s.steps(c)) == (5, 4, 2)  # b kept its count


def test_step_chunks_queues_a_step_and_returns_only_the_refusals() -> None:
    s: BatchScheduler[str] = BatchScheduler(3, window=0.0)
    a, b, c = launch(s, "a"), launch(s, "b"), launch(s, "c")
    plan(s)
    s.member_failed(b, "boom")
    assert s.step_chunks([(a, ("a1", "a2")), (c, ("c1",))]) == []
    refused = s.step_chunks([(a, ("a3",)), (b, ("b1",))])
    assert [type(r) for r in refused] == [Ignored] and refused[0].handle == b
    assert s.drain(a) == Drained(a, ("a1", "a2", "a3"), ended=False)
    assert s.drain(c) == Drained(c, ("c1",), ended=False)
    assert s.drain(b) == Drained(b, (), ended=True, error="boom")  # nothing queued after
    assert s.drain(a) is s.drain(a) == Drained(a, (), ended=False)  # one empty answer


def test_a_member_whose_owner_does_not_read_is_held_after_max_ahead_engine_calls() -> None:
    s: BatchScheduler[str] = BatchScheduler(2, window=0.0, max_ahead=2)
    a, b = launch(s, "a"), launch(s, "b")
    plan(s)
    assert s.step_chunks([]) == []  # the join: no chunks, still an engine call
    s.step_chunks([(a, ["a1"]), (b, ["b1"])])
    assert s.drain(b).chunks == ("b1",)  # b's owner reads, a's does not
    s.step_chunks([(a, ["a2"]), (b, ["b2"])])
    assert not s.held(a.slot) and not s.held(b.slot)  # a1 waits since one more call
    s.step_chunks([(a, ["a3"]), (b, ["b3"])])
    assert s.held(a.slot) and not s.held(b.slot)  # a1 waits since two more calls
    assert s.drain(a).chunks == ("a1", "a2", "a3") and not s.held(a.slot)  # read: a goes on
    s.step_chunks([(b, ["b4"])])
    assert s.held(b.slot)  # b2 waits since two more calls
    assert s.read(b) == Chunk(b, "b2")
    assert not s.held(b.slot)  # the owner reads: two more calls before it is held again
    s.step_chunks([])
    assert not s.held(b.slot)
    s.step_chunks([])
    assert s.held(b.slot)
    assert s.read(b) == Chunk(b, "b3") and not s.held(b.slot)
    assert s.read(b) == Chunk(b, "b4") and not s.held(b.slot)  # nothing waits now
    s.step_chunks([])
    s.step_chunks([])
    assert not s.held(b.slot)


def test_max_ahead_none_never_holds_and_must_be_positive() -> None:
    s: BatchScheduler[str] = BatchScheduler(1, window=0.0, max_ahead=None)
    h = launch(s, "a")
    plan(s)
    for i in range(10):
        s.step_chunks([(h, [str(i)])])
    assert not s.held(h.slot)
    assert BatchScheduler(1).max_ahead == MAX_AHEAD
    with pytest.raises(ValueError, match="max_ahead"):
        BatchScheduler(1, max_ahead=0)
