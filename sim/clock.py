"""Virtual time that the simulator owns, tie-breaks included.

Every timed wait in a simulation (fake session work, scenario arrivals, the
runtime's admission deadlines) goes through :meth:`SimClock.sleep_until`. The
driver (:meth:`SimClock.drive`) waits until every task is blocked, then wakes
the earliest sleepers, in one of two scheduling modes (:class:`Scheduling`):

* ``ONE_AT_A_TIME``: exactly one sleeper per step; among sleepers due at the
  same instant, the one the seeded RNG picks, and the system runs to
  quiescence before the next. Simultaneous events are *ordered*, never
  interleaved inside their handlers.
* ``TOGETHER``: every sleeper due at the earliest instant wakes in the same
  step, and trio's seeded run queue interleaves their tasks checkpoint by
  checkpoint, as real trio and asyncio do. This reaches races between two
  events of one instant (a disconnect landing while a load fails) that the
  first mode cannot.

Which mode a run uses is chosen by its seed (swarm style, :meth:`Scheduling.for_seed`)
unless the scenario names one. Either way, the same seed gives the same run.

trio's own scheduler is made deterministic too (see :func:`seed_trio`): it only
orders tasks made runnable by the same wake-up, and with a seeded shuffle that
order is a function of the seed as well.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import random
from collections.abc import Callable

import attrs
import trio
import trio.testing


class Scheduling(enum.Enum):
    """How the driver wakes sleepers due at the same instant."""

    ONE_AT_A_TIME = "one_at_a_time"
    TOGETHER = "together"

    @classmethod
    def for_seed(cls, seed: int) -> Scheduling:
        """The mode a run with ``seed`` uses when its scenario names none (half the seeds each)."""
        return (
            cls.TOGETHER
            if random.Random(seed * 2654435761 + 97).random() < 0.5
            else cls.ONE_AT_A_TIME
        )


def seed_trio(seed: int) -> None:
    """Make trio's run-queue order a function of ``seed`` (its Hypothesis hook, by hand)."""
    from trio._core import _run

    _run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    _run._r.seed(seed)


@attrs.define(eq=False)
class _Sleeper:
    deadline: float
    seq: int
    event: trio.Event = attrs.field(factory=trio.Event)
    fired: bool = False
    gone: bool = False  # cancelled before it fired: skipped when it reaches the heap's top


class SimClock:
    """The virtual clock and the one place where simultaneous events are ordered."""

    def __init__(
        self,
        rng: random.Random,
        mock: trio.testing.MockClock | None = None,
        scheduling: Scheduling = Scheduling.ONE_AT_A_TIME,
    ) -> None:
        self.rng = rng
        self.mock = mock
        self.scheduling = scheduling
        self._now = 0.0
        # a heap of (deadline, seq, sleeper); cancelled sleepers stay until popped
        self._sleepers: list[tuple[float, int, _Sleeper]] = []
        self._live = 0
        self._seq = itertools.count()
        self.wakeups = 0
        self.ties = 0

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float | None) -> None:
        """Block until the driver wakes this sleeper at ``deadline`` (never, if None)."""
        if deadline is None:
            await trio.sleep_forever()
        sleeper = _Sleeper(max(deadline, self._now), next(self._seq))
        heapq.heappush(self._sleepers, (sleeper.deadline, sleeper.seq, sleeper))
        self._live += 1
        try:
            await sleeper.event.wait()
        finally:
            if not sleeper.fired:
                sleeper.gone = True
                self._live -= 1

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + seconds)

    def pending(self) -> int:
        """How many sleepers wait for the driver."""
        return self._live

    async def drive(
        self,
        limit: float | None = None,
        *,
        on_step: Callable[[], None] | None = None,
        on_stall: Callable[[], bool] | None = None,
    ) -> None:
        """Wake sleepers (as :attr:`scheduling` says) until none is left (or virtual time passes
        ``limit``).

        ``on_step`` runs each time the system is quiescent (every task blocked),
        before the next wake-up: the place to check invariants. ``on_stall``
        runs when every task is blocked and no sleeper is left; it returns True
        if it made progress possible (cancelled something), False to stop.
        """
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if on_step is not None:
                on_step()
            heap = self._sleepers
            while heap and heap[0][2].gone:
                heapq.heappop(heap)
            if not heap:
                if on_stall is not None and on_stall():
                    continue
                return
            first = heap[0][0]
            if limit is not None and first > limit:
                return
            due: list[_Sleeper] = []  # every live sleeper due at ``first``, in seq order
            while heap and heap[0][0] == first:
                sleeper = heapq.heappop(heap)[2]
                if not sleeper.gone:
                    due.append(sleeper)
            if len(due) > 1:
                self.ties += 1
            if self.scheduling is Scheduling.TOGETHER:
                self.rng.shuffle(due)  # the order their tasks enter trio's (seeded) run queue
                chosen = due
            else:
                pick = due[self.rng.randrange(len(due))] if len(due) > 1 else due[0]
                for other in due:
                    if other is not pick:
                        heapq.heappush(heap, (other.deadline, other.seq, other))
                chosen = [pick]
            if self.mock is not None and first > self._now:
                self.mock.jump(first - self._now)
            self._now = first
            for sleeper in chosen:
                self._live -= 1
                sleeper.fired = True
                self.wakeups += 1
                sleeper.event.set()
