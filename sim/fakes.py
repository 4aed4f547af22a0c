"""Fake sessions whose work takes scripted virtual time and fails on cue.

:class:`FakeProvider` implements the runtime's ModelProvider for any number of
fake models. Each model's :class:`FakeScript` says how long loading, session
creation, cloning, running and teardown take, its advertised capacity, and
which failures to inject (load failure, null primary, clone k failure, run
exception, slow or hung teardown). The provider also keeps the books the
simulator's invariants need: live sessions and weights per model, and any
weight destroyed while a session built on it was still alive.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from core.batching import MAX_AHEAD
from core.engine import BatchEngine, Emitted, Member
from core.pool import Interface, Session, SessionFactory
from core.stopping import stop_point
from server.runtime.ports import Clock, ModelSpec


@attrs.define
class FakeScript:
    """Durations (virtual seconds) and faults of one fake model."""

    capacity: int = 4
    load_time: float = 0.5
    create_time: float = 0.1
    clone_time: float = 0.05
    close_time: float = 0.01
    release_time: float = 0.0
    run_time: float = 1.0
    chunk_time: float = 0.2
    chunks: int = 3
    fail_loads: int = 0
    null_primary: int = 0
    fail_clone_at: int | None = None
    interfaces: tuple[str, ...] = ("offline", "streaming", "batch")
    step_time: float = 0.1
    member_step_time: float = 0.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> FakeScript:
        fields = {f.name for f in attrs.fields(cls)}
        unknown = set(raw) - fields
        if unknown:
            raise ValueError(f"unknown model script keys: {sorted(unknown)}")
        data = dict(raw)
        if "interfaces" in data:
            data["interfaces"] = tuple(data["interfaces"])
        return cls(**data)


@attrs.define(eq=False)
class FakeWeights:
    model: str
    revision: str
    alive: bool = True
    sessions: int = (
        0  # live sessions built on these weights (a probe's weights differ from the pool's)
    )


@attrs.define(eq=False)
class FakeSession:
    """A fake session: identity, the weights it shares and its private stream state."""

    sid: int
    family: str
    task: str
    mode: str
    interfaces: frozenset[Interface]
    weights: FakeWeights
    runs: int = 0
    closed: bool = False

    def run(self, request: Any) -> Any:
        return {"revision": self.weights.revision, "session": self.sid}

    def stream(self, request: Any) -> Iterator[Any]:
        yield self.run(request)

    def batch(self, requests: Sequence[Any]) -> list[Any]:
        return [self.run(r) for r in requests]

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@attrs.define(eq=False)
class FakeFactory:
    """The loaded fake model: shared weights and the recipe for sessions."""

    spec: ModelSpec
    script: FakeScript
    weights: FakeWeights
    new_session: Callable[[FakeFactory], FakeSession]  # the provider's books: every session counted

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def mode(self) -> str:
        return self.spec.mode

    def capacity(self) -> int:
        cap = self.spec.session_options.get("capacity", self.script.capacity)
        return int(cap)

    def create(self) -> Session:
        """A session at once (the provider adds the scripted time and faults around it)."""
        return self.new_session(self)

    def clone(self, primary: Session) -> Session:
        """Another session on the same weights."""
        return self.new_session(self)


class FakeRunError(RuntimeError):
    """A run failure injected by a request (``fail = true``)."""


AHEAD_BOUND = 2 * (MAX_AHEAD + 1)
"""Chunks a batched stream member may have made beyond those its client has taken: the
owner's queue (at most ``MAX_AHEAD + 1`` engine calls' chunks, one each, before the member
is held: :meth:`core.batching.BatchScheduler.held`) plus the chunks of the owner's last
drain that the client has not taken yet (at most as many)."""


@attrs.define(eq=False)
class Reader:
    """A stream's client as its batched member sees it: how many chunks it has taken (the
    simulator's stream action counts them; a fake engine checks :data:`AHEAD_BOUND`)."""

    action: str
    taken: int = 0

    def __repr__(self) -> str:  # traces and findings show the action, never an address
        return f"Reader({self.action!r}, taken={self.taken})"


@attrs.define
class _FakeMember:
    request: Mapping[str, Any]
    stream: bool
    steps: int  # steps left
    done: int = 0  # steps taken
    reported: bool = False  # ran ahead of its reader (reported once)


@attrs.define(eq=False)
class FakeEngine:
    """A batched engine over fake weights: every member takes a number of steps.

    A run member needs ``duration / step_time`` steps (at least one) and emits its
    result at the last; a stream member emits one chunk per step (``chunks``
    steps). ``fail`` fails the member when it joins, ``fail_step = k`` at its
    k-th step. The engine keeps the books the simulator checks: a key joined
    while its previous member is still in the engine, a step over a member that
    is not in it, or any use after close is reported through ``problem``.
    """

    model: str
    script: FakeScript
    weights: FakeWeights
    max_batch: int
    problem: Callable[[str], None]
    ran_ahead: Callable[[str], None]
    members: dict[int, _FakeMember] = attrs.field(factory=dict)
    closed: bool = False
    joined: int = 0

    def _check(self) -> None:
        if self.closed or not self.weights.alive:
            self.problem(f"batched engine of '{self.model}' used after destruction")

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        self._check()
        out = []
        for m in members:
            if m.key in self.members or not 0 <= m.key < self.max_batch:
                self.problem(f"'{self.model}': batch key {m.key} joined while still taken")
            req = dict(m.request or {})
            if req.get("fail"):
                out.append(Emitted(m.key, error=FakeRunError("injected run failure")))
                self.members[m.key] = _FakeMember(req, m.stream, 0)
                continue
            if m.stream:
                steps = int(req.get("chunks", self.script.chunks))
            else:
                duration = float(req.get("duration", self.script.run_time))
                steps = max(1, round(duration / self.script.step_time))
            self.members[m.key] = _FakeMember(req, m.stream, steps)
            self.joined += 1
            out.append(Emitted(m.key, done=steps == 0))
        return out

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        self._check()
        return [self._advance(key) for key in keys]

    def _advance(self, key: int) -> Emitted:
        member = self.members.get(key)
        if member is None or member.steps <= 0:
            self.problem(f"'{self.model}': batch key {key} stepped while not decoding")
            return Emitted(key, error=FakeRunError("not decoding"))
        member.steps -= 1
        member.done += 1
        if member.done == int(member.request.get("fail_step", 0)):
            return Emitted(key, error=FakeRunError("injected step failure"))
        revision = self.weights.revision
        if member.stream:
            self._check_reader(key, member)
            chunk = {"revision": revision, "batch_slot": key, "chunk": member.done - 1}
            return Emitted(key, (chunk,), done=member.steps == 0)
        if member.steps > 0:
            return Emitted(key)
        return Emitted(key, ({"revision": revision, "batch_slot": key},), done=True)

    def _check_reader(self, key: int, member: _FakeMember) -> None:
        reader = member.request.get("reader")
        if not isinstance(reader, Reader) or member.reported:
            return
        if member.done - reader.taken > AHEAD_BOUND:
            member.reported = True
            self.ran_ahead(
                f"'{self.model}': batch key {key} ({reader.action}) made chunk {member.done} "
                f"while its client had taken {reader.taken} (at most {AHEAD_BOUND} ahead)"
            )

    def leave(self, key: int) -> None:
        self.members.pop(key, None)

    def close(self) -> None:
        if self.members:
            self.problem(
                f"batched engine of '{self.model}' closed with members {sorted(self.members)}"
            )
        self.closed = True


class FakeProvider:
    """ModelProvider over fake models, in virtual time."""

    def __init__(self, clock: Clock, scripts: Mapping[str, FakeScript]) -> None:
        self.clock = clock
        self.scripts = dict(scripts)
        self._sid = itertools.count(1)
        self.live_sessions: dict[str, int] = {}
        self.live_weights: dict[str, int] = {}
        self.loads: dict[str, int] = {}
        self.clone_attempts: dict[str, int] = {}
        self.premature: list[str] = []
        self.ran_ahead: list[str] = []  # batched stream members ahead of their readers
        self.events: list[tuple[float, str, str]] = []
        self.hooks: dict[tuple[str, str], list[Callable[[], None]]] = {}

    def on_next(self, model: str, event: str, hook: Callable[[], None]) -> None:
        """Call ``hook`` once, the next time ``model`` reaches ``event`` (``load_end``: its weights
        finished loading or failed, before the runtime learns which), in that same step."""
        self.hooks.setdefault((model, event), []).append(hook)

    def _fire(self, model: str, event: str) -> None:
        for hook in self.hooks.pop((model, event), []):
            hook()

    async def _sleep(self, seconds: float) -> None:
        await self.clock.sleep_until(self.clock.now() + seconds)

    def script(self, model: str) -> FakeScript:
        return self.scripts.setdefault(model, FakeScript())

    def _log(self, model: str, what: str) -> None:
        self.events.append((self.clock.now(), model, what))

    async def load(self, spec: ModelSpec) -> SessionFactory:
        script = self.script(spec.id)
        self.loads[spec.id] = self.loads.get(spec.id, 0) + 1
        self._log(spec.id, "load_start")
        await self._sleep(script.load_time)
        self._fire(spec.id, "load_end")
        if script.fail_loads > 0:
            script.fail_loads -= 1
            self._log(spec.id, "load_failed")
            raise RuntimeError(f"injected load failure for '{spec.id}'")
        self.live_weights[spec.id] = self.live_weights.get(spec.id, 0) + 1
        self._log(spec.id, "load_done")
        return FakeFactory(spec, script, FakeWeights(spec.id, spec.path or spec.id), self._session)

    async def release(self, spec: ModelSpec, factory: SessionFactory) -> None:
        assert isinstance(factory, FakeFactory)
        await self._sleep(factory.script.release_time)
        if factory.weights.sessions > 0:
            self.premature.append(f"weights of '{spec.id}' freed with live sessions")
        factory.weights.alive = False
        self.live_weights[spec.id] -= 1
        self._log(spec.id, "weights_freed")

    def _session(self, factory: FakeFactory) -> FakeSession:
        interfaces = frozenset(Interface(i) for i in factory.script.interfaces)
        model = factory.spec.id
        self.live_sessions[model] = self.live_sessions.get(model, 0) + 1
        factory.weights.sessions += 1
        return FakeSession(
            next(self._sid), factory.family, factory.task, factory.mode, interfaces, factory.weights
        )

    async def create(self, factory: SessionFactory) -> Session:
        assert isinstance(factory, FakeFactory)
        await self._sleep(factory.script.create_time)
        self.clone_attempts[factory.spec.id] = 0
        if factory.script.null_primary > 0:
            factory.script.null_primary -= 1
            return None  # type: ignore[return-value]
        return factory.create()

    async def clone(self, factory: SessionFactory, primary: Session) -> Session:
        assert isinstance(factory, FakeFactory)
        await self._sleep(factory.script.clone_time)
        model = factory.spec.id
        self.clone_attempts[model] = self.clone_attempts.get(model, 0) + 1
        if (
            factory.script.fail_clone_at is not None
            and self.clone_attempts[model] == factory.script.fail_clone_at
        ):
            factory.script.fail_clone_at = None
            raise RuntimeError(f"injected clone failure for '{model}'")
        return factory.clone(primary)

    async def close(self, session: Session) -> None:
        assert isinstance(session, FakeSession)
        script = self.script(session.weights.model)
        close_time = script.close_time
        await self._sleep(close_time if math.isfinite(close_time) else 1e12)
        if not session.weights.alive:
            self.premature.append(f"session {session.sid} closed after its weights")
        session.closed = True
        self.live_sessions[session.weights.model] -= 1
        session.weights.sessions -= 1

    def _check(self, session: Session) -> FakeSession:
        assert isinstance(session, FakeSession)
        if session.closed or not session.weights.alive:
            self.premature.append(f"session {session.sid} used after destruction")
        return session

    async def _work(self, seconds: float, steps: int) -> None:
        """``seconds`` of session work in ``steps`` equal steps, with a stop point between
        two steps (:mod:`core.stopping`: a cancelled request's run ends there)."""
        for i in range(steps):
            if i:
                stop_point()
            await self._sleep(seconds / steps)

    async def run(self, session: Session, request: Any) -> Any:
        s = self._check(session)
        req = dict(request or {})
        script = self.script(s.weights.model)
        await self._work(float(req.get("duration", script.run_time)), int(req.get("steps", 1)))
        s.runs += 1
        if req.get("fail"):
            raise FakeRunError("injected run failure")
        return {"revision": s.weights.revision, "session": s.sid}

    async def stream(self, session: Session, request: Any) -> AsyncIterator[Any]:
        s = self._check(session)
        req = dict(request or {})
        script = self.script(s.weights.model)
        n = int(req.get("chunks", script.chunks))
        for i in range(n):
            await self._sleep(float(req.get("chunk_time", script.chunk_time)))
            yield {"revision": s.weights.revision, "session": s.sid, "chunk": i}
        s.runs += 1

    async def batch(self, session: Session, requests: Sequence[Any]) -> list[Any]:
        s = self._check(session)
        script = self.script(s.weights.model)
        total = sum(float(dict(r or {}).get("duration", script.run_time)) for r in requests)
        steps = max((int(dict(r or {}).get("steps", 1)) for r in requests), default=1)
        await self._work(total, steps)
        s.runs += len(requests)
        return [
            {"revision": s.weights.revision, "session": s.sid, "index": i}
            for i in range(len(requests))
        ]

    async def reset(self, session: Session) -> None:
        return None

    # ------------------------------------------------------------ batching
    async def engine(self, factory: SessionFactory, max_batch: int) -> BatchEngine:
        assert isinstance(factory, FakeFactory)
        return FakeEngine(
            factory.spec.id,
            factory.script,
            factory.weights,
            max_batch,
            self.premature.append,
            self.ran_ahead.append,
        )

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]:
        assert isinstance(engine, FakeEngine)
        return engine.join(members)

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        """One batched step: ``step_time`` plus ``member_step_time`` per member, whatever
        the batch (the point of batching: the weights are read once per step)."""
        assert isinstance(engine, FakeEngine)
        script = engine.script
        await self._sleep(script.step_time + script.member_step_time * len(keys))
        return engine.step(keys)

    async def leave(self, engine: BatchEngine, key: int) -> None:
        assert isinstance(engine, FakeEngine)
        engine.leave(key)

    async def close_engine(self, engine: BatchEngine) -> None:
        assert isinstance(engine, FakeEngine)
        engine.close()
