"""BatchScheduler.poll in O(changes) plans exactly what the O(slots) walk planned.

:class:`Walk` is the membership rule as it was first written: every poll walks every
slot, stops the members at ``max_steps``, finishes the stopped ones, joins the pending
ones by the policy and counts a step for every active one. A Hypothesis state machine
plays the same random owners and driver against both and requires the same decision
at every call: plans (join, advance, finish, waiting, reason), waits, idles, states and
step counts.
"""

from __future__ import annotations

import collections

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.batching import (
    WINDOW_SPAN,
    BatchScheduler,
    Finish,
    Idle,
    Launched,
    SlotHandle,
    SlotState,
    StepPlan,
    WaitUntil,
)
from core.events import Reason


@attrs.define
class _Member:
    epoch: int = 0
    state: SlotState = SlotState.FREE
    arrived: float = 0.0
    steps: int = 0
    stop_reason: Reason = Reason.MEMBER_STOPPED


class Walk:
    """The reference: membership decisions by walking every slot at every poll."""

    def __init__(self, max_batch: int, window: float, continuous: bool, max_steps: int | None):
        self.max_batch, self.window = max_batch, window
        self.continuous, self.max_steps = continuous, max_steps
        self.slots = [_Member() for _ in range(max_batch)]
        self.free = collections.deque(range(max_batch))
        self.pending: collections.deque[int] = collections.deque()

    def launch(self, now: float) -> SlotHandle | None:
        if not self.free:
            return None
        index = self.free.popleft()
        self.slots[index] = _Member(self.slots[index].epoch + 1, SlotState.PENDING, now)
        self.pending.append(index)
        return SlotHandle(index, self.slots[index].epoch)

    def _window_end(self) -> float:
        """A window after the latest pending arrival, at most WINDOW_SPAN after the first."""
        arrivals = [self.slots[i].arrived for i in self.pending]
        return min(max(arrivals) + self.window, arrivals[0] + WINDOW_SPAN * self.window)

    def poll(self, now: float) -> Idle | WaitUntil | StepPlan:
        finish = []
        for index, slot in enumerate(self.slots):
            at_max = self.max_steps is not None and slot.steps >= self.max_steps
            if slot.state is SlotState.ACTIVE and at_max:
                slot.state, slot.stop_reason = SlotState.STOPPED, Reason.MAX_STEPS
            if slot.state is SlotState.STOPPED:
                slot.state = SlotState.FINISHING
                emit = slot.stop_reason is not Reason.CANCELLED
                finish.append(Finish(SlotHandle(index, slot.epoch), emit, slot.stop_reason))
        running = any(slot.state is SlotState.ACTIVE for slot in self.slots)
        join = []
        held = Reason.GRANTED
        full = len(self.pending) >= self.max_batch
        if self.pending and running and not self.continuous:
            held = Reason.ROUND_RUNNING
        elif self.pending and not running and not full and now < self._window_end():
            held = Reason.COLLECTION_WINDOW
            if not finish:
                return WaitUntil(self._window_end())
        elif self.pending:
            while self.pending:
                index = self.pending.popleft()
                self.slots[index].state = SlotState.ACTIVE
                join.append(SlotHandle(index, self.slots[index].epoch))
        advance = []
        for index, slot in enumerate(self.slots):
            if slot.state is SlotState.ACTIVE:
                slot.steps += 1
                advance.append(SlotHandle(index, slot.epoch))
        if not (join or advance or finish):
            return Idle()
        return StepPlan(tuple(join), tuple(advance), tuple(finish), len(self.pending), held)

    def stop(self, h: SlotHandle, reason: Reason) -> None:
        slot = self.slots[h.slot]
        if slot.epoch == h.epoch and slot.state is SlotState.ACTIVE:
            slot.state, slot.stop_reason = SlotState.STOPPED, reason

    def abort(self, h: SlotHandle) -> None:
        slot = self.slots[h.slot]
        if slot.epoch == h.epoch and slot.state is SlotState.PENDING:
            self.pending.remove(h.slot)
            slot.state = SlotState.FINISHED
        self.stop(h, Reason.CANCELLED)

    def fail(self, h: SlotHandle) -> None:
        slot = self.slots[h.slot]
        live = (SlotState.ACTIVE, SlotState.STOPPED, SlotState.FINISHING)
        if slot.epoch == h.epoch and slot.state in live:
            slot.state = SlotState.FINISHED

    def tail_done(self, h: SlotHandle) -> None:
        slot = self.slots[h.slot]
        if slot.epoch == h.epoch and slot.state is SlotState.FINISHING:
            slot.state = SlotState.FINISHED

    def release(self, h: SlotHandle) -> None:
        slot = self.slots[h.slot]
        if slot.epoch == h.epoch and slot.state is SlotState.FINISHED:
            self.slots[h.slot] = _Member(slot.epoch + 1)
            self.free.append(h.slot)


class SameDecisions(RuleBasedStateMachine):
    """The same random calls on the scheduler and on the reference walk."""

    @initialize(
        max_batch=st.integers(1, 5),
        continuous=st.booleans(),
        max_steps=st.sampled_from((None, 0, 1, 2, 4)),
    )
    def setup(self, max_batch: int, continuous: bool, max_steps: int | None) -> None:
        self.s: BatchScheduler[int] = BatchScheduler(
            max_batch, window=0.01, join_between_steps=continuous, max_steps=max_steps
        )
        self.ref = Walk(max_batch, 0.01, continuous, max_steps)
        self.now = 0.0
        self.handles: list[SlotHandle] = []  # every handle given out, stale ones too

    @rule(dt=st.sampled_from((0.0, 0.004, 0.02)))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def launch(self) -> None:
        got = self.s.launch(len(self.handles), self.now)
        expected = self.ref.launch(self.now)
        if expected is None:
            assert not isinstance(got, Launched)
            return
        assert isinstance(got, Launched) and got.handle == expected
        self.handles.append(expected)

    @rule(at_once=st.booleans())
    def poll(self, at_once: bool) -> None:
        got = self.s.poll(self.now)
        assert got == self.ref.poll(self.now)
        if isinstance(got, StepPlan) and at_once:  # the finish decisions, carried out at once
            for f in got.finish:
                self.s.tail_done(f.handle)
                self.ref.tail_done(f.handle)

    @precondition(lambda self: bool(self.handles))
    @rule(data=st.data())
    def tail_done(self, data: st.DataObject) -> None:
        """A finish carried out later: owners' events may land while the member is finishing."""
        h = data.draw(st.sampled_from(self.handles))
        self.s.tail_done(h)
        self.ref.tail_done(h)

    @precondition(lambda self: bool(self.handles))
    @rule(data=st.data(), event=st.sampled_from(("finished", "failed", "abort", "release")))
    def member_event(self, data: st.DataObject, event: str) -> None:
        h = data.draw(st.sampled_from(self.handles))
        if event == "finished":
            self.s.member_finished(h)
            self.ref.stop(h, Reason.MEMBER_STOPPED)
        elif event == "failed":
            self.s.member_failed(h, "boom")
            self.ref.fail(h)
        elif event == "abort":
            self.s.abort(h)
            self.ref.abort(h)
        else:
            self.s.release(h)
            self.ref.release(h)

    @invariant()
    def same_states_and_steps(self) -> None:
        if not hasattr(self, "s"):
            return
        for index, slot in enumerate(self.ref.slots):
            assert self.s.state(index) is slot.state
        for h in self.handles:
            slot = self.ref.slots[h.slot]
            expected = (
                slot.steps if slot.epoch == h.epoch and slot.state is not SlotState.FREE else 0
            )
            assert self.s.steps(h) == expected
        assert self.s.free_slots() == tuple(self.ref.free)
        assert self.s.pending() == tuple(
            SlotHandle(i, self.ref.slots[i].epoch) for i in self.ref.pending
        )
        active = [i for i, slot in enumerate(self.ref.slots) if slot.state is SlotState.ACTIVE]
        assert self.s.active_members() == len(active)
        for index, slot in enumerate(self.ref.slots):
            live = None if slot.state is SlotState.FREE else SlotHandle(index, slot.epoch)
            assert self.s.handle_of(index) == live
            assert self.s.active_handle(index) == (live if index in active else None)


SameDecisions.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestSameDecisions = SameDecisions.TestCase
