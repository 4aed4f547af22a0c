"""Continuous-batching membership for autoregressive decode (FireRedTTS3 style, seed 004).

:class:`BatchScheduler` owns a fixed number of batch slots and decides, sans-IO,
who joins the batch, who advances each decode step, whose tail is emitted and when
a slot may be reused. The driver (one decode task that does all device work) loops::

    plan = scheduler.poll(now)       # Idle | WaitUntil | StepPlan
    prefill plan.join; run one batched step over plan.advance;
    report chunk_ready / member_finished / member_failed as they happen;
    for f in plan.finish: emit one tail if f.emit_tail; tail_done(f.handle)

Request owners :meth:`~BatchScheduler.launch`, :meth:`~BatchScheduler.read` (or
:meth:`~BatchScheduler.drain`) their chunks, and :meth:`~BatchScheduler.release`
the slot once they have seen the end. The fixes of reference §6.5 are built in:

* a finished slot returns to the free list only when its owner releases it, never
  when decoding ends, so a new launch cannot reset a slot still being drained;
* a handle is (slot, epoch); the epoch is carried across the slot reset and bumped
  on launch and release, so a stale handle reads :class:`StaleHandle`, never
  another request's chunks;
* a stopped member is listed in exactly one plan's ``finish`` with one decision
  about its tail (emit, or not when aborted), never twice.

:meth:`~BatchScheduler.poll` costs what changed since the last poll, not the slot
count: the active members are kept in slot order as they join and leave, a plan's
``advance`` is that list's tuple (the same object from one step to the next while
nobody joins or leaves), every member keeps one :class:`SlotHandle` per epoch, and a
member's step count is the scheduler's count of steps since it joined.

Two join policies: ``join_between_steps=True`` (continuous batching, the default):
pending members join the running batch at the next step boundary;
``False`` (FireRed's round rule): a new round starts only when no member is
active, so newcomers wait for the running round to drain. Either way a
*collection window* lets simultaneous arrivals start together when nothing runs: it
closes ``window`` after the latest pending arrival, so a burst of requests arriving a
little apart (HTTP requests parsed one after another) starts as one batch, but never
later than :data:`WINDOW_SPAN` windows after the first arrival; a request alone waits
one window, as before.
"""

from __future__ import annotations

import bisect
import collections
import enum
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

import attrs

from core.events import Reason

C = TypeVar("C")


class SlotState(enum.Enum):
    """A slot's life: FREE -> PENDING -> ACTIVE -> STOPPED -> FINISHING -> FINISHED -> FREE."""

    FREE = "free"
    PENDING = "pending"  # launched, waiting to join the batch
    ACTIVE = "active"  # joined: advances once per step
    STOPPED = "stopped"  # decode ended (stop, max steps, abort); tail not yet decided
    FINISHING = "finishing"  # listed in a plan's finish: tail being emitted
    FINISHED = "finished"  # done; waits for its owner to drain and release


class Outcome(enum.Enum):
    """How a launched request ended."""

    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"


@attrs.frozen(order=True)
class SlotHandle:
    """The owner's ticket to one slot, valid only while the slot's epoch matches."""

    slot: int
    epoch: int


@attrs.frozen
class Launched:
    """The request got a slot; it is pending until a plan lists it in ``join``."""

    handle: SlotHandle
    request_id: Hashable
    reason: Reason = Reason.GRANTED


@attrs.frozen
class Rejected:
    """Every slot is taken (running, or finished and not yet released by its owner)."""

    request_id: Hashable
    reason: Reason = Reason.BATCH_FULL
    message: str = "batch slot pool exhausted"


@attrs.frozen
class Idle:
    """Nothing to do until the next launch."""


@attrs.frozen
class WaitUntil:
    """Collection window: nothing runs and the pending list is not full; poll again at
    ``deadline``."""

    deadline: float
    reason: Reason = Reason.COLLECTION_WINDOW


@attrs.frozen
class Finish:
    """Finish one stopped member now: emit its tail once if ``emit_tail``, then call tail_done."""

    handle: SlotHandle
    emit_tail: bool
    reason: Reason


@attrs.frozen
class StepPlan:
    """One step boundary: prefill ``join``, advance ``advance`` once, finish ``finish``.

    ``advance`` includes the members that join now. ``waiting`` counts pending
    members left out, with ``reason`` saying why (round running, collection window).
    """

    join: tuple[SlotHandle, ...]
    advance: tuple[SlotHandle, ...]
    finish: tuple[Finish, ...]
    waiting: int = 0
    reason: Reason = Reason.GRANTED


@attrs.frozen
class Ack:
    """The event was applied; the slot is now in ``state``."""

    handle: SlotHandle
    state: SlotState
    reason: Reason


@attrs.frozen
class Ignored:
    """The event did not apply to the slot's state (e.g. release too early); nothing changed."""

    handle: SlotHandle
    state: SlotState
    reason: Reason
    message: str


@attrs.frozen
class StaleHandle:
    """The handle's epoch is gone (slot released or reused): nothing was read or changed."""

    handle: SlotHandle
    reason: Reason = Reason.STALE_HANDLE


@attrs.frozen
class Released:
    """The slot is free again; ``discarded`` chunks were never read."""

    handle: SlotHandle
    outcome: Outcome
    discarded: int
    reason: Reason = Reason.GRANTED


@attrs.frozen
class Chunk(Generic[C]):
    """The oldest unread chunk of the handle's request."""

    handle: SlotHandle
    data: C


@attrs.frozen
class NotReady:
    """No chunk yet and the request is still running: wait for the next chunk_ready."""

    handle: SlotHandle


@attrs.frozen
class EndOfStream:
    """Every chunk was read and the request ended; the owner should release now."""

    handle: SlotHandle
    outcome: Outcome
    reason: Reason


@attrs.frozen
class Failed:
    """The request failed; reads keep saying so until the owner releases."""

    handle: SlotHandle
    message: str
    reason: Reason = Reason.MEMBER_FAILED


@attrs.frozen
class Drained(Generic[C]):
    """Every queued chunk, and whether the stream has ended (``error`` when it failed)."""

    handle: SlotHandle
    chunks: tuple[C, ...]
    ended: bool
    error: str | None = None


_NO_HANDLE = SlotHandle(-1, -1)  # a free slot's (never handed out)

WINDOW_SPAN = 5
"""The most windows a collection may last from its first arrival while arrivals keep
coming (each extends it to its own arrival plus a window)."""

MAX_AHEAD = 3
"""Engine calls a member may decode past its owner's oldest unread chunk
(:meth:`BatchScheduler.held`): one sentence a call for Piper's streams, so at most four
sentences wait for a stalled client; slack enough that an owner a step or two late on a
busy event loop is not held."""


@attrs.define
class _Slot(Generic[C]):
    epoch: int = 0
    state: SlotState = SlotState.FREE
    request_id: Hashable = None
    arrived: float = 0.0
    steps: int = 0
    chunks: collections.deque[C] = attrs.field(factory=collections.deque)
    stop_reason: Reason = Reason.MEMBER_STOPPED
    outcome: Outcome | None = None
    error: str | None = None
    handle: SlotHandle = _NO_HANDLE  # this epoch's, the one object every plan lists
    joined: int = 0  # the scheduler's step count when the member joined (while active)
    nothing: Drained[C] | None = None  # what an empty drain says while the member runs
    unread_since: int = -1  # chunks wait since this delivery, or the owner's read after it


_LIVE = (SlotState.ACTIVE, SlotState.STOPPED, SlotState.FINISHING)


class BatchScheduler(Generic[C]):
    """Sans-IO slot membership of one batched decoder (see module doc)."""

    def __init__(
        self,
        max_batch: int,
        *,
        window: float = 0.008,
        join_between_steps: bool = True,
        max_steps: int | None = None,
        max_ahead: int | None = MAX_AHEAD,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_ahead is not None and max_ahead < 1:
            raise ValueError("max_ahead must be at least 1 (or None)")
        self.max_batch = max_batch
        self.window = window
        self.join_between_steps = join_between_steps
        self.max_steps = max_steps
        self.max_ahead = max_ahead
        self._deliveries = 0  # step_chunks calls: one a join or step of the engine
        self._slots: list[_Slot[C]] = [_Slot() for _ in range(max_batch)]
        self._free: collections.deque[int] = collections.deque(range(max_batch))
        self._pending: collections.deque[int] = collections.deque()
        # the active members, in slot order, and their handles (the same positions)
        self._active: list[int] = []
        self._active_handles: list[SlotHandle] = []
        self._advance: tuple[SlotHandle, ...] | None = ()  # None: rebuild from the list
        self._stopped: list[int] = []  # stopped since the last poll: finished by the next
        self._step_count = 0  # plans that advanced the active members
        # with max_steps: (joined, slot, epoch) in join order, the oldest reaching it first
        self._joins: collections.deque[tuple[int, int, int]] = collections.deque()

    # ------------------------------------------------------------- owner side

    def launch(self, request_id: Hashable, now: float) -> Launched | Rejected:
        """Take the oldest free slot (FIFO reuse) for ``request_id``, or reject: batch full."""
        if not self._free:
            return Rejected(request_id)
        index = self._free.popleft()
        epoch = self._slots[index].epoch + 1  # carried across the reset below
        handle = SlotHandle(index, epoch)
        self._slots[index] = _Slot(epoch, SlotState.PENDING, request_id, now, handle=handle)
        self._pending.append(index)
        return Launched(handle, request_id)

    def read(self, handle: SlotHandle) -> Chunk[C] | NotReady | EndOfStream | Failed | StaleHandle:
        """The next chunk of the owner's own request; a stale handle reads nothing."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.error is not None:
            return Failed(handle, slot.error)
        if slot.chunks:
            chunk = Chunk(handle, slot.chunks.popleft())
            slot.unread_since = self._deliveries if slot.chunks else -1  # the owner reads
            return chunk
        if slot.state is SlotState.FINISHED:
            assert slot.outcome is not None
            return EndOfStream(handle, slot.outcome, slot.stop_reason)
        return NotReady(handle)

    def drain(self, handle: SlotHandle) -> Drained[C] | StaleHandle:
        """Take every queued chunk at once, saying whether the stream has ended."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        queued = slot.chunks
        if queued:
            chunks = tuple(queued)
            queued.clear()
            slot.unread_since = -1
            return Drained(handle, chunks, slot.state is SlotState.FINISHED, slot.error)
        if slot.state is SlotState.FINISHED or slot.error is not None:
            return Drained(handle, (), slot.state is SlotState.FINISHED, slot.error)
        if slot.nothing is None:  # one answer for every empty drain of a running member
            slot.nothing = Drained(handle, (), False)
        return slot.nothing

    def release(self, handle: SlotHandle) -> Released | Ignored | StaleHandle:
        """Return a finished slot to the back of the free list and bump its epoch.

        Stale handles are a no-op (release is idempotent); an unfinished slot is
        Ignored (too early: abort first). Unread chunks are discarded.
        """
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.state is not SlotState.FINISHED:
            return Ignored(
                handle, slot.state, Reason.SLOT_NOT_FINISHED, "release before the slot finished"
            )
        assert slot.outcome is not None
        released = Released(handle, slot.outcome, len(slot.chunks))
        self._slots[handle.slot] = _Slot(slot.epoch + 1)
        self._free.append(handle.slot)
        return released

    def abort(self, handle: SlotHandle) -> Ack | Ignored | StaleHandle:
        """Cancel a request: pending -> finished at once; active -> stopped, finished with no
        tail."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.state is SlotState.PENDING:
            self._pending.remove(handle.slot)
            slot.stop_reason = Reason.CANCELLED
            self._end(slot, Outcome.ABORTED)
            return Ack(handle, slot.state, Reason.CANCELLED)
        if slot.state is SlotState.ACTIVE:
            self._stop(handle.slot, slot, Reason.CANCELLED)
            return Ack(handle, slot.state, Reason.CANCELLED)
        return Ignored(handle, slot.state, Reason.INVALID_STATE, "request already stopped")

    # ------------------------------------------------------------ driver side

    def poll(self, now: float) -> Idle | WaitUntil | StepPlan:
        """Decide the next step boundary. A StepPlan is a command: carry it out before polling
        again.

        Order: stopped members are finished (each exactly once); pending members
        join if the policy allows (continuous: always; round rule: only when no
        member is active) and the collection window has closed or the pending list
        is full; then every active member, joiners included, advances once. Lists are in
        slot order (``join``: arrival order). The cost is the number of members that
        stopped or joined since the last poll, not the slot count.
        """
        if self.max_steps is not None:
            self._stop_at_max_steps(self.max_steps)
        finish = self._finishes()
        running = bool(self._active)
        join: list[SlotHandle] = []
        held = Reason.GRANTED
        if self._pending and running and not self.join_between_steps:
            held = Reason.ROUND_RUNNING
        elif self._pending and not running and (end := self._window_end(now)) is not None:
            held = Reason.COLLECTION_WINDOW
            if not finish:
                return WaitUntil(end)
        elif self._pending:
            while self._pending:
                join.append(self._join(self._pending.popleft()))
        self._step_count += 1  # every active member, joiners included, advances once
        advance = self._advance
        if advance is None:
            advance = self._advance = tuple(self._active_handles)
        if not (join or advance or finish):
            return Idle()
        return StepPlan(tuple(join), advance, tuple(finish), len(self._pending), held)

    def chunk_ready(self, handle: SlotHandle, data: C) -> Ack | Ignored | StaleHandle:
        """Queue a decoded chunk (or the tail) for the owner; only while the member is live."""
        return self.chunks_ready(handle, (data,))

    def chunks_ready(self, handle: SlotHandle, chunks: Sequence[C]) -> Ack | Ignored | StaleHandle:
        """Queue several chunks of one member at once, in order (:meth:`chunk_ready` for each,
        one decision for all)."""
        refused = self._queue(handle, chunks)
        if refused is not None:
            return refused
        return Ack(handle, self._slots[handle.slot].state, Reason.GRANTED)

    def step_chunks(
        self, deliveries: Iterable[tuple[SlotHandle, Sequence[C]]]
    ) -> list[Ignored | StaleHandle]:
        """:meth:`chunks_ready` for each ``(handle, chunks)`` of a step, in order; only the
        refusals are returned (none when every member was decoding). The driver calls it
        once for every engine call (a join or a step), chunks or not: :meth:`held` counts
        those calls."""
        self._deliveries += 1
        refused: list[Ignored | StaleHandle] = []
        for handle, chunks in deliveries:
            refusal = self._queue(handle, chunks)
            if refusal is not None:
                refused.append(refusal)
        return refused

    def _queue(self, handle: SlotHandle, chunks: Sequence[C]) -> Ignored | StaleHandle | None:
        """Queue ``chunks`` for the owner while the member is live; else why not."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.state not in _LIVE:
            return Ignored(handle, slot.state, Reason.INVALID_STATE, "member is not decoding")
        if chunks and not slot.chunks:
            slot.unread_since = self._deliveries
        slot.chunks.extend(chunks)
        return None

    def held(self, slot: int) -> bool:
        """Whether the member on ``slot`` waits for its owner: chunks wait, and the owner has
        not read for :attr:`max_ahead` engine calls (joins and steps, :meth:`step_chunks`)
        since the oldest of them was queued. A member whose owner stops reading (a client
        that does not read its stream) then stops decoding, however long its request,
        instead of filling memory and taking the batch's time until a write deadline; it
        goes on once its owner reads. A slow reader paces its member; a stalled one stops
        it. (:meth:`drain` takes every queued chunk, so with it at most ``max_ahead + 1``
        engine calls' chunks wait.)"""
        state = self._slots[slot]
        return (
            self.max_ahead is not None
            and state.unread_since >= 0
            and self._deliveries - state.unread_since >= self.max_ahead
        )

    def member_finished(self, handle: SlotHandle) -> Ack | Ignored | StaleHandle:
        """The member hit its stop condition: it leaves the batch; its tail comes in the next
        plan."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.state is not SlotState.ACTIVE:
            return Ignored(handle, slot.state, Reason.INVALID_STATE, "member is not active")
        self._stop(handle.slot, slot, Reason.MEMBER_STOPPED)
        return Ack(handle, slot.state, Reason.MEMBER_STOPPED)

    def tail_done(self, handle: SlotHandle) -> Ack | Ignored | StaleHandle:
        """The finish decision was carried out: the request is finished, awaiting its owner."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.state is not SlotState.FINISHING:
            return Ignored(handle, slot.state, Reason.INVALID_STATE, "no finish was planned")
        cancelled = slot.stop_reason is Reason.CANCELLED
        self._end(slot, Outcome.ABORTED if cancelled else Outcome.COMPLETED)
        return Ack(handle, slot.state, slot.stop_reason)

    def member_failed(self, handle: SlotHandle, message: str) -> Ack | Ignored | StaleHandle:
        """Prefill, a step or the tail failed: the member is finished with ``message``, no tail."""
        slot = self._slot(handle)
        if slot is None:
            return StaleHandle(handle)
        if slot.state not in _LIVE:
            return Ignored(handle, slot.state, Reason.INVALID_STATE, "member is not decoding")
        if slot.state is SlotState.ACTIVE:
            self._leave_active(handle.slot, slot)
        slot.error = message
        self._end(slot, Outcome.FAILED)
        return Ack(handle, slot.state, Reason.MEMBER_FAILED)

    # ---------------------------------------------------------------- queries

    def state(self, slot: int) -> SlotState:
        """The state of slot index ``slot``."""
        return self._slots[slot].state

    def handle_of(self, slot: int) -> SlotHandle | None:
        """The live handle of slot ``slot``, or None when it is free."""
        record = self._slots[slot]
        return None if record.state is SlotState.FREE else record.handle

    def active_handle(self, slot: int) -> SlotHandle | None:
        """The handle of slot ``slot`` while its member is active (advances at every step)."""
        record = self._slots[slot]
        return record.handle if record.state is SlotState.ACTIVE else None

    def active_members(self) -> int:
        """How many members are active (joined, not stopped)."""
        return len(self._active)

    def request_of(self, handle: SlotHandle) -> Hashable | None:
        """The request a valid handle belongs to."""
        slot = self._slot(handle)
        return None if slot is None else slot.request_id

    def steps(self, handle: SlotHandle) -> int:
        """How many steps the member has been planned to advance (0 for stale handles)."""
        slot = self._slot(handle)
        if slot is None:
            return 0
        return self._step_count - slot.joined if slot.state is SlotState.ACTIVE else slot.steps

    def free_slots(self) -> tuple[int, ...]:
        """Free slot indexes in reuse (FIFO) order."""
        return tuple(self._free)

    def pending(self) -> tuple[SlotHandle, ...]:
        """Launched members not yet joined, in arrival order."""
        return tuple(self._slots[i].handle for i in self._pending)

    # --------------------------------------------------------------- helpers

    def _slot(self, handle: SlotHandle) -> _Slot[C] | None:
        if not 0 <= handle.slot < self.max_batch:
            return None
        slot = self._slots[handle.slot]
        if slot.state is SlotState.FREE or slot.epoch != handle.epoch:
            return None
        return slot

    def _end(self, slot: _Slot[C], outcome: Outcome) -> None:
        slot.state, slot.outcome = SlotState.FINISHED, outcome

    def _join(self, index: int) -> SlotHandle:
        """A pending member becomes active: into the slot-ordered active list."""
        slot = self._slots[index]
        slot.state, slot.joined = SlotState.ACTIVE, self._step_count
        at = bisect.bisect_left(self._active, index)
        self._active.insert(at, index)
        self._active_handles.insert(at, slot.handle)
        self._advance = None
        if self.max_steps is not None:
            self._joins.append((slot.joined, index, slot.epoch))
        return slot.handle

    def _leave_active(self, index: int, slot: _Slot[C]) -> None:
        """An active member leaves the batch: its step count is kept, its place dropped."""
        slot.steps = self._step_count - slot.joined
        at = bisect.bisect_left(self._active, index)
        del self._active[at], self._active_handles[at]
        self._advance = None

    def _stop(self, index: int, slot: _Slot[C], reason: Reason) -> None:
        """An active member stops; the next poll finishes it."""
        self._leave_active(index, slot)
        slot.state, slot.stop_reason = SlotState.STOPPED, reason
        self._stopped.append(index)

    def _stop_at_max_steps(self, max_steps: int) -> None:
        """Stop the members that advanced ``max_steps`` times: the oldest joins first (every
        active member advances at every plan), entries of members gone since dropped."""
        joins = self._joins
        while joins:
            joined, index, epoch = joins[0]
            slot = self._slots[index]
            if slot.state is SlotState.ACTIVE and slot.epoch == epoch:
                if self._step_count - joined < max_steps:
                    return
                self._stop(index, slot, Reason.MAX_STEPS)
            joins.popleft()

    def _finishes(self) -> list[Finish]:
        """Every member stopped since the last poll moves to FINISHING, in slot order, with
        its one tail decision."""
        if not self._stopped:
            return []
        stopped, self._stopped = sorted(self._stopped), []
        finish: list[Finish] = []
        for index in stopped:
            slot = self._slots[index]
            if slot.state is SlotState.STOPPED:  # not failed since
                slot.state = SlotState.FINISHING
                emit = slot.stop_reason is not Reason.CANCELLED
                finish.append(Finish(slot.handle, emit, slot.stop_reason))
        return finish

    def _window_end(self, now: float) -> float | None:
        """When the pending members' collection window closes, while it is open at ``now``
        (None once it closed, or when the pending members fill the batch): a window after
        the latest arrival, at most :data:`WINDOW_SPAN` windows after the first."""
        if len(self._pending) >= self.max_batch:
            return None
        first = self._slots[self._pending[0]].arrived
        latest = self._slots[self._pending[-1]].arrived  # arrival order
        end = min(latest + self.window, first + WINDOW_SPAN * self.window)
        return end if now < end else None
