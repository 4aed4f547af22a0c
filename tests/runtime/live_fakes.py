"""A fake batched engine for the runtime's live-member tests (tests/runtime/test_batched_live.py,
tests/runtime/test_batched_stress.py): it echoes its members' input."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from core.engine import Emitted, Feed, Member

BOOM = "boom"
"""A piece that fails its member."""


@attrs.define(eq=False)
class EchoEngine:
    """Live members: their feed's pieces, at most ``per_step`` a step (the rest held); a
    member without a feed: its request's pieces, one in its join, then one a step. A
    "boom" piece fails its member."""

    max_batch: int
    per_step: int
    live_input: bool = True
    feeds: dict[int, Feed | None] = attrs.field(factory=dict)
    held: dict[int, list[Any]] = attrs.field(factory=dict)
    steps: list[tuple[Feed | None, ...]] = attrs.field(factory=list)  # each step's feeds

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        out = []
        for m in members:
            assert m.key not in self.feeds, "joined over a member still in the engine"
            self.feeds[m.key] = m.feed
            self.held[m.key] = [] if m.feed is not None else list(m.request)
            out.append(Emitted(m.key) if m.feed is not None else self._emit(m.key, False))
        return out

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        self.steps.append(tuple(self.feeds[key] for key in keys))
        out = []
        for key in keys:
            feed, closed = self.feeds[key], True
            if feed is not None:
                pieces, closed = feed.take()
                self.held[key].extend(pieces)
            out.append(self._emit(key, closed))
        return out

    def _emit(self, key: int, closed: bool) -> Emitted:
        held = self.held[key]
        now, held[:] = held[: self.per_step], held[self.per_step :]
        feed = self.feeds[key]
        if feed is not None:
            feed.hold(bool(held))
        if BOOM in now:
            return Emitted(key, tuple(now[: now.index(BOOM)]), error=RuntimeError(BOOM))
        return Emitted(key, tuple(now), done=closed and not held)

    def leave(self, key: int) -> None:
        self.feeds.pop(key, None)
        self.held.pop(key, None)

    def close(self) -> None:
        assert not self.feeds, "closed with members"
