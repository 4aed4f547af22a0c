"""When a step of live members starts: the live window counts from the last step's start.

Live streams push at their own phases; a step that took the first ready member at
once would run many tiny steps, so the decode task waits for the others' input up
to :attr:`~server.runtime.batch_driver.BatchDriver.live_window` after the last
step began, and no longer: once a step took longer than the window, the members
that pushed meanwhile step at once (waiting a window after every step put 5-6 ms
of idle engine between steps at 1,100 VAD streams, and the steps grew with it:
docs/performance.md). On trio's virtual clock (autojump), so the instants are exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import trio
import trio.testing

from core.engine import BatchEngine, Emitted
from tests.runtime.live_fakes import LiveProvider, Owners, runtime, steps, until

WINDOW = 0.004
Seen = tuple[list[float], list[tuple[int, ...]]]


class TimedProvider(LiveProvider):
    """A step takes ``step_s`` of (virtual) time; each step's start is recorded."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s
        self.starts: list[float] = []

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        self.starts.append(trio.current_time())
        out = engine.step(keys)
        await trio.sleep(self.step_s)
        return out


def play(step_s: float, pushes: list[tuple[float, int]]) -> Seen:
    """Three live members (the third never pushes); ``pushes``: (seconds after the first
    push, owner). Each step's start after the first push, and its members."""
    provider = TimedProvider(step_s)

    async def main() -> Seen:
        async with runtime(provider) as rt, anyio.create_task_group() as tg:
            owners = await Owners.open(rt, tg, 3)
            driver = rt.drivers["m"]
            await until(lambda: driver.scheduler.active_members() == 3)
            driver.live_window = WINDOW
            await anyio.wait_all_tasks_blocked()
            start = trio.current_time()
            for at, owner in pushes:
                await trio.sleep_until(start + at)
                owners.feeds[owner].push(f"{owner}@{at}")
            await until(lambda: sum(map(len, owners.got)) == len(pushes))
            seen = [round(t - start, 6) for t in provider.starts], steps(provider, owners)
            for feed in owners.feeds:
                feed.close()
        return seen

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_push_after_a_quiet_time_steps_at_once() -> None:
    starts, members = play(0.001, [(0.0, 0)])
    assert (starts, members) == ([0.0], [(0,)])


def test_a_push_soon_after_a_step_waits_until_a_window_after_that_steps_start() -> None:
    # the first step runs 0-1 ms; member 1 pushes at 2 ms and 2 ms later a window has
    # passed since the first step began (waiting a window from the push: 6 ms)
    starts, members = play(0.001, [(0.0, 0), (0.002, 1), (0.003, 0)])
    assert starts == [0.0, WINDOW]
    assert members == [(0,), (0, 1)]


def test_after_a_step_longer_than_the_window_the_pushes_it_overlapped_step_at_once() -> None:
    # the first step runs 0-10 ms; both pushes land during it; the next step starts as it
    # ends (waiting a window then: 14 ms)
    starts, members = play(0.010, [(0.0, 0), (0.001, 1), (0.002, 0)])
    assert starts == [0.0, 0.010]
    assert members == [(0,), (0, 1)]
