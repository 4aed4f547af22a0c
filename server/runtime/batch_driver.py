"""The decode task of a batched model: one task does all of its device work.

A model registered with ``batching`` runs its requests through one
:class:`~core.engine.BatchEngine` instead of one session per lease. Admission
does not change: a request still leases a slot (the slot count is the batch
capacity), then launches into the model's :class:`core.batching.BatchScheduler`.
:class:`BatchDriver` is the scheduler's driver (reference §6): its one task
polls for the next step boundary, prefills the members that join, advances
every active member with one batched step, delivers each member's chunks to
its owner and finishes the members that stopped. Owners read their own chunks
and release their batch slot only after they have seen the end (the §6.5 fix:
a finished slot is never reused while its owner still drains it).

Guarantees kept from the unbatched path:

* engine work is shielded: a step that started finishes; cancellation of the
  driver lands only between steps (it is idle whenever a pool is torn down,
  since teardown waits for every lease);
* an owner that goes away (client gone, stream closed) aborts its member: a
  pending member ends at once, an active one leaves at the next step boundary;
  the owner waits (shielded) until the member has left the engine before its
  lease is released, so a slot is never reused under a member still decoding;
* one member's failure ends that member only; an engine error in a step fails
  the members of that step, never the driver.

Live members (a :class:`~core.engine.Feed`, input arriving while they run) step
only when their feed is ready; when every active member waits for input and
nothing joins or finishes, the decode task sleeps until a push, a launch or an
abort wakes it (no empty steps, no spinning). Each owner is woken only when its
own member produced, ended or failed.

What a step costs the event loop grows with the members that step, not with the
slots: a push marks its member (the marks are the only members a step looks at,
checked against the feed and the scheduler's state), the scheduler's plan is
O(changes), and an owner is woken once per step however many chunks it got,
reads them all with one :meth:`~core.batching.BatchScheduler.drain`, and parks
on its slot (:class:`_Parking`: on trio the task itself, no event per wait).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import trio
import trio.lowlevel

from core.batching import (
    BatchScheduler,
    Idle,
    Launched,
    SlotHandle,
    SlotState,
    StaleHandle,
    StepPlan,
    WaitUntil,
)
from core.engine import BatchEngine, Emitted, Feed, LiveInputEngine, Member
from core.events import Reason, TraceRecord
from server.runtime.errors import InvalidRequestError
from server.runtime.ports import BatchingProvider, Clock

log = logging.getLogger("voxpool.runtime")

COLLECTION_WINDOW_S = 0.002
"""How long a batch waits, when nothing runs, for simultaneous arrivals to start together."""

LIVE_WINDOW_S = 0.004
"""How long after the last step began a step of live members waits for the others' input:
live streams arrive at their own phases, and stepping at every push would run many tiny steps
(each with its fixed cost) instead of a few large ones. Counted from the last step's start, not
from the first ready push: after a step longer than this, the members that pushed meanwhile
step at once (waiting a window after every step left the engine idle 5-6 ms between steps at
1,100 VAD streams, and the steps grew with it). At most this much latency is added."""


class BatchMemberFailed(RuntimeError):
    """A member failed without an exception of its own (should not happen; kept for safety)."""


class _Parking(abc.ABC):
    """Where each owner waits for its member's next chunks: at most one waiter per slot (its
    owner), woken by the driver alone. A wake with nobody parked is a no-op: an owner parks
    only after a drain found nothing, with no checkpoint in between."""

    def __init__(self, size: int) -> None:
        self._parked: list[Any] = [None] * size

    def _claim(self, slot: int) -> None:
        """Refuse a second waiter on ``slot``: one owner per slot is what makes a slot's
        shared abort (trio) safe, and two would mean a slot reused while its old owner
        still reads (a runtime bug, never a client's)."""
        if self._parked[slot] is not None:
            raise RuntimeError(f"batch slot {slot}: an owner is already waiting on it")

    @abc.abstractmethod
    async def wait(self, slot: int) -> None:
        """Park the calling owner until it is woken (a checkpoint: cancellation lands here)."""

    @abc.abstractmethod
    def wake(self, handles: Sequence[SlotHandle]) -> None:
        """Wake the owners parked on the slots of ``handles``, if any."""


class _TrioParking(_Parking):
    """trio: the owner's task is parked and rescheduled, as an event's wait is, with nothing
    allocated per wait but its abort callback."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._aborts = [functools.partial(self._abort, slot) for slot in range(size)]

    def _abort(self, slot: int, _: Any) -> trio.lowlevel.Abort:
        self._parked[slot] = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self, slot: int) -> None:
        self._claim(slot)
        self._parked[slot] = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._aborts[slot])

    def wake(self, handles: Sequence[SlotHandle]) -> None:
        parked, reschedule = self._parked, trio.lowlevel.reschedule
        for handle in handles:
            task = parked[handle.slot]
            if task is not None:
                parked[handle.slot] = None
                reschedule(task)


class _FutureParking(_Parking):
    """asyncio: the owner awaits a future of its own (what an event's wait does)."""

    async def wait(self, slot: int) -> None:
        self._claim(slot)
        future = asyncio.get_running_loop().create_future()
        self._parked[slot] = future
        try:
            await future
        finally:
            if self._parked[slot] is future:
                self._parked[slot] = None

    def wake(self, handles: Sequence[SlotHandle]) -> None:
        parked = self._parked
        for handle in handles:
            future = parked[handle.slot]
            if future is not None:
                parked[handle.slot] = None
                if not future.done():
                    future.set_result(None)


def _parking(size: int) -> _Parking:
    """The owners' parking for the running event loop."""
    if trio.lowlevel.in_trio_run():
        return _TrioParking(size)
    return _FutureParking(size)


class BatchDriver:
    """Drives one model's :class:`BatchScheduler` over its :class:`BatchEngine`."""

    def __init__(
        self,
        model: str,
        engine: BatchEngine,
        calls: BatchingProvider,
        clock: Clock,
        *,
        violation: Callable[[str], None],
        trace: Callable[[TraceRecord], None] | None = None,
        window: float = COLLECTION_WINDOW_S,
        live_window: float = LIVE_WINDOW_S,
    ) -> None:
        self.model = model
        self.engine = engine
        self.calls = calls
        self.clock = clock
        self.violation = violation
        self.trace = trace
        self.scheduler: BatchScheduler[Any] = BatchScheduler(engine.max_batch, window=window)
        self.live_window = live_window
        self._requests: dict[SlotHandle, Member] = {}
        self._errors: dict[SlotHandle, BaseException] = {}
        # by slot (one holder at a time: a slot is reused only after its owner released it):
        # the epoch of the member the engine holds there (-1: none), a live member's feed
        self._in_engine: list[int] = [-1] * engine.max_batch
        self._feeds: list[Feed | None] = [None] * engine.max_batch
        self._parked: _Parking | None = None  # where owners wait (made in the event loop)
        # the members that may advance at the next step: every active member that is not
        # live or has input (a push marks it; a step drops the marks of those without)
        self._marks: list[int] = []
        self._marked = bytearray(engine.max_batch)
        # members the last look for ready ones left out, held by owners that have not read
        # (scheduler.held: they keep their marks; an owner's read wakes the decode task)
        self.held_members = 0
        self._progress = anyio.Event()
        self._wake = anyio.Event()
        self._stopped = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self.steps = 0
        self._last_step = -float("inf")  # when the last step began (the live window's start)

    @property
    def members(self) -> int:
        """Launched members whose owners have not released their batch slot yet."""
        return len(self._requests)

    # ------------------------------------------------------------ owner side
    async def run(self, request: Any) -> Any:
        """One run member: launch, wait for its one result, release (however it ends)."""
        async with self.member(request, stream=False) as chunks:
            results = [chunk async for chunk in chunks]
        if len(results) != 1:
            raise BatchMemberFailed(f"a run member produced {len(results)} results, not 1")
        return results[0]

    @asynccontextmanager
    async def member(
        self, request: Any, *, stream: bool, feed: Feed | None = None
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """Hold one batch slot for the block: its chunks as they are decoded.

        Leaving the block early aborts the member; either way the block ends only
        after the member has left the engine and its slot was released. ``feed``:
        a live member, whose input the owner pushes while it runs (refused,
        before launching, by an engine that takes no live input).
        """
        if feed is not None and not (
            isinstance(self.engine, LiveInputEngine) and self.engine.live_input
        ):
            raise InvalidRequestError(
                Reason.INVALID_STATE, f"model '{self.model}' takes no live input"
            )
        launched = self.scheduler.launch(request_id=None, now=self.clock.now())
        if not isinstance(launched, Launched):
            # admission leases at most max_batch holders, so this is a bug
            self.violation(f"'{self.model}': batch launch refused with a slot leased")
            raise BatchMemberFailed(launched.message)
        handle = launched.handle
        if feed is not None:
            feed.on_push = functools.partial(self._pushed, handle.slot)
        self._requests[handle] = Member(handle.slot, request, stream, feed)
        self._feeds[handle.slot] = feed
        self._wake.set()
        try:
            yield self._chunks(handle)
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish(handle)

    async def _chunks(self, handle: SlotHandle) -> AsyncIterator[Any]:
        """The member's chunks as the owner reads them: every queued chunk at each wake-up (a
        failure first: its chunks are not delivered); cancellation (a client gone, a stream
        cancelled) lands between chunks, even among chunks one step queued at once (a chunk
        read after waiting needs no check: the wait was one)."""
        parked = self._parking()
        waited = False
        while True:
            held = self.scheduler.held(handle.slot)
            got = self.scheduler.drain(handle)
            if isinstance(got, StaleHandle):
                self.violation(f"'{self.model}': batch slot {handle.slot} reused before release")
                raise BatchMemberFailed("batch slot was reused before its owner released it")
            if got.error is not None:
                raise self._errors.pop(handle, None) or BatchMemberFailed(got.error)
            if got.chunks:  # drain again after them: steps may have queued more meanwhile
                if held:  # read at last: the member (still marked) may decode again
                    self._wake.set()
                for chunk in got.chunks:
                    if not waited:
                        await anyio.lowlevel.checkpoint_if_cancelled()
                    waited = False
                    yield chunk
            elif got.ended:
                return
            else:  # nothing queued: a step's wake-up comes only to a parked owner
                await parked.wait(handle.slot)
                waited = True

    def _parking(self) -> _Parking:
        if self._parked is None:
            self._parked = _parking(self.engine.max_batch)
        return self._parked

    async def _finish(self, handle: SlotHandle) -> None:
        """Abort if still running, wait until the member left the engine, release the slot."""
        self.scheduler.abort(handle)
        self._wake.set()
        while self._live(handle):
            await self._progress.wait()
        if isinstance(self.scheduler.release(handle), StaleHandle):
            self.violation(f"'{self.model}': batch slot {handle.slot} reused before release")
        self._requests.pop(handle, None)
        self._errors.pop(handle, None)
        feed = self._feeds[handle.slot]
        if feed is not None:
            feed.on_push = None  # a late push no longer marks the slot's next member
        self._feeds[handle.slot] = None

    def _live(self, handle: SlotHandle) -> bool:
        """Whether the member may still decode: the engine holds it, or it has not finished."""
        if self._in_engine[handle.slot] == handle.epoch:
            return True
        if self.scheduler.handle_of(handle.slot) != handle:
            return False
        return self.scheduler.state(handle.slot) is not SlotState.FINISHED

    def check(self) -> list[str]:
        """The §6.5 ownership rule, as a state check: no batch slot is on the free list
        while its owner still holds it (the owner releases it only after the end)."""
        free = set(self.scheduler.free_slots())
        return [
            f"'{self.model}': batch slot {handle.slot} is free while its owner holds it (§6.5)"
            for handle in self._requests
            if handle.slot in free
        ]

    # ----------------------------------------------------------- driver side
    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """The decode loop; runs until :meth:`stop`. Steps are shielded."""
        try:
            with anyio.CancelScope() as self._scope:
                task_status.started()
                while True:
                    plan = self.scheduler.poll(self.clock.now())
                    if isinstance(plan, StepPlan):
                        ready = await self._gather(plan)
                        with anyio.CancelScope(shield=True):
                            did = await self._carry_out(plan, ready)
                        if not did:  # live members only, none with new input
                            await self._idle(Idle())
                    else:
                        await self._idle(plan)
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        """End the decode loop (between steps) and wait for it to exit."""
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()

    async def _idle(self, plan: Idle | WaitUntil) -> None:
        if self._wake.is_set():
            self._wake = anyio.Event()
            return
        if isinstance(plan, Idle):
            await self._wake.wait()
            return
        with anyio.CancelScope() as scope:
            wake = self._wake

            async def watch() -> None:
                await wake.wait()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await self.clock.sleep_until(plan.deadline)
                tg.cancel_scope.cancel()

    async def _carry_out(self, plan: StepPlan, ready: list[SlotHandle] | None) -> bool:
        """Finish, join, step: the plan's commands, in that order. The step advances the
        active members that are ready (a live member waits for input; ``ready``: those
        :meth:`_gather` just found, when nothing happened since); False when there was
        nothing to do at all: nothing finished or joined and no active member was ready."""
        for finish in plan.finish:
            await self._leave(finish.handle)
            self.scheduler.tail_done(finish.handle)
        if plan.join:
            joiners = [self._requests[h] for h in plan.join]
            for handle in plan.join:
                self._in_engine[handle.slot] = handle.epoch
                self._mark(handle.slot)
            emitted = await self._engine_call(plan.join, self.calls.join, joiners)
            await self._deliver(plan.join, emitted)
        if ready is None or plan.finish or plan.join:
            ready = self._ready()
        if not (ready or plan.join or plan.finish) and self.scheduler.active_members():
            return False
        self._record(plan, ready)
        if ready:
            self.steps += 1
            self._last_step = self.clock.now()
            keys = [h.slot for h in ready]
            await self._deliver(ready, await self._engine_call(ready, self.calls.step, keys))
        self._notify((*(f.handle for f in plan.finish), *plan.join, *ready))
        return True

    async def _gather(self, plan: StepPlan) -> list[SlotHandle] | None:
        """Before a step of live members only (nothing joins or finishes): once one is ready
        and another (not held by its owner) is not, wait for the others' input until
        :attr:`live_window` after the last step began, so that they step together. The ready
        members when it did not wait (None: look again). Cancellation (the driver stopping)
        may land here: nothing was done yet."""
        if plan.join or plan.finish or self.live_window <= 0:
            return None
        ready = self._ready()
        if 0 < len(ready) < self.scheduler.active_members() - self.held_members:
            until = self._last_step + self.live_window
            if until > self.clock.now():
                await self.clock.sleep_until(until)
                return None
        return ready

    def _ready(self) -> list[SlotHandle]:
        """The members that can advance now, in slot order: active (joined, not stopped, in
        the engine), not live or with input in their feed, and not held by an owner that
        has not read (:meth:`BatchScheduler.held`: counted in :attr:`held_members`, and kept
        marked for the step after that owner's read). Only marked members are looked at; the
        marks of the others are dropped (their next push marks them again)."""
        marks, marked = self._marks, self._marked
        self.held_members = 0
        if not marks:
            return []
        marks.sort()
        scheduler, in_engine, feeds = self.scheduler, self._in_engine, self._feeds
        ready: list[SlotHandle] = []
        for slot in marks:
            handle = scheduler.active_handle(slot)
            feed = feeds[slot]
            waiting = feed is not None and not feed.ready
            if handle is None or in_engine[slot] != handle.epoch or waiting:
                marked[slot] = 0
            elif scheduler.held(slot):
                self.held_members += 1
            else:
                ready.append(handle)
        if len(ready) + self.held_members < len(marks):
            self._marks = [slot for slot in marks if marked[slot]]
        return ready

    def _mark(self, slot: int) -> None:
        """The member on ``slot`` may have something to do at the next step."""
        if not self._marked[slot]:
            self._marked[slot] = 1
            self._marks.append(slot)

    def _pushed(self, slot: int) -> None:
        """A live member's owner pushed input (or closed its feed): mark the member and wake
        the decode task."""
        if not self._marked[slot]:
            self._marked[slot] = 1
            self._marks.append(slot)
        self._wake.set()

    def _record(self, plan: StepPlan, active: Sequence[SlotHandle]) -> None:
        """Trace the step boundary as a typed record (metrics count steps and members)."""
        if self.trace is None:
            return
        fields = {
            "join": [h.slot for h in plan.join],
            "advance": [h.slot for h in active],
            "finish": [[f.handle.slot, f.emit_tail] for f in plan.finish],
            "waiting": plan.waiting,
        }
        summary = " ".join(f"{key}={value}" for key, value in fields.items())
        record = TraceRecord(0, self.clock.now(), self.model, "batch_step", {}, summary, "", fields)
        self.trace(record)

    async def _engine_call(
        self, handles: Sequence[SlotHandle], call: Callable[..., Any], arg: Any
    ) -> list[Emitted]:
        """One engine call; an engine error fails every member it was for."""
        try:
            emitted: list[Emitted] = await call(self.engine, arg)
        except Exception as exc:
            log.exception("batched step of '%s' failed", self.model)
            return [Emitted(h.slot, error=exc) for h in handles]
        if [e.key for e in emitted] != [h.slot for h in handles]:
            self.violation(f"'{self.model}': engine answered for the wrong members")
            error = BatchMemberFailed("the engine answered for the wrong members")
            return [Emitted(h.slot, error=error) for h in handles]
        return emitted

    async def _deliver(self, handles: Sequence[SlotHandle], emitted: Sequence[Emitted]) -> None:
        """Queue each member's chunks; a failed member ends and leaves the engine at once."""
        failed: list[SlotHandle] = []
        pairs = list(zip(handles, emitted, strict=True))
        self.scheduler.step_chunks([(handle, out.chunks) for handle, out in pairs if out.chunks])
        for handle, out in pairs:
            if out.error is not None:
                self._errors[handle] = out.error
                self.scheduler.member_failed(handle, str(out.error) or type(out.error).__name__)
                failed.append(handle)
            elif out.done:
                self.scheduler.member_finished(handle)
        for handle in failed:
            await self._leave(handle)

    async def _leave(self, handle: SlotHandle) -> None:
        """The engine forgets the member; only then may its owner release the slot."""
        try:
            await self.calls.leave(self.engine, handle.slot)
        except Exception:
            log.exception("leaving the batch of '%s' failed", self.model)
        if self._in_engine[handle.slot] == handle.epoch:
            self._in_engine[handle.slot] = -1

    def _notify(self, handles: Sequence[SlotHandle]) -> None:
        """Wake the owners of ``handles`` (their members produced, ended or failed) and
        whoever waits for any step (owners waiting for their member to leave)."""
        self._parking().wake(handles)
        self._progress.set()
        self._progress = anyio.Event()
