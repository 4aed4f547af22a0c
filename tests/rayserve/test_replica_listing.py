"""Ray's list of a replica's models while a request is on its way to the runtime.

CI of stop 34 saw a model loaded on one replica that Ray listed on none, for
two minutes: the replica's reporter trimmed Ray's list while a request for the
model had been listed but not yet admitted by the runtime (its upload still
being read), so the load that request then made was never routed to again.
These tests drive :class:`server.ray.replica.VoxpoolReplica`'s request path
without a cluster: Ray's multiplex wrapper, the runtime's status and the replay
of the request are stand-ins; the live cluster test is test_ray_serve.py.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ray")

from ray import serve

from server.ray import multiplex, replica
from server.ray.exchange import Forwarded, Part, Start
from server.ray.replica import VoxpoolReplica


class Wrapper:
    """Stands for Ray's ``_ModelMultiplexWrapper``: the ids it lists, oldest first."""

    def __init__(self) -> None:
        self.models: OrderedDict[str, str] = OrderedDict()
        self._push_multiplexed_replica_info = False

    async def load_model(self, model_id: str) -> str:
        self.models[model_id] = model_id
        return model_id


@attrs.define
class Row:
    id: str
    loaded: bool = False
    active_slots: int = 0
    queued_requests: int = 0


class Runtime:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def status(self) -> list[Row]:
        return self.rows


@attrs.define
class State:
    runtime: Runtime


class Replica(VoxpoolReplica):
    def __del__(self) -> None:  # type: ignore[override]
        """Nothing to tear down: no runtime was started."""


def a_replica() -> tuple[VoxpoolReplica, Runtime]:
    owner = object.__new__(Replica)
    runtime = Runtime()
    owner.state = State(runtime)  # type: ignore[assignment]
    owner.replica_id = "r1"
    owner.app = None  # type: ignore[assignment]
    owner.handling = Counter()
    setattr(owner, multiplex.WRAPPER_ATTRIBUTE, Wrapper())
    return owner, runtime


REQUEST = Forwarded("POST", "/v1/audio/vad", b"", (), b"")


def test_a_model_whose_request_is_not_yet_admitted_stays_listed_through_a_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, runtime = a_replica()
    reading, admitted = asyncio.Event(), asyncio.Event()

    async def replay(app: Any, request: Forwarded) -> AsyncIterator[Part]:
        reading.set()  # the upload is being read: the runtime has not seen the request
        await admitted.wait()
        runtime.rows = [Row("silero_vad", loaded=True)]  # the request loaded the model
        yield Start(200, ())
        yield b"{}"

    monkeypatch.setattr(replica, "replay", replay)
    monkeypatch.setattr(serve, "get_multiplexed_model_id", lambda: "silero_vad")

    async def scenario() -> list[str]:
        async def request() -> None:
            async for _ in owner.handle(REQUEST):
                pass

        task = asyncio.ensure_future(request())
        await reading.wait()
        assert multiplex.listed(owner) == ["silero_vad"]
        owner._trim()  # the reporter's trim, every REPORT_INTERVAL_S
        assert multiplex.listed(owner) == ["silero_vad"]
        admitted.set()
        await task
        return multiplex.listed(owner)

    assert asyncio.run(scenario()) == ["silero_vad"]


def test_a_request_that_ends_without_a_load_leaves_its_model_unlisted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, _ = a_replica()

    async def replay(app: Any, request: Forwarded) -> AsyncIterator[Part]:
        yield Start(400, ())  # refused before any load: the runtime keeps nothing
        yield b"{}"

    monkeypatch.setattr(replica, "replay", replay)
    monkeypatch.setattr(serve, "get_multiplexed_model_id", lambda: "silero_vad")

    async def scenario() -> list[str]:
        async for _ in owner.handle(REQUEST):
            pass
        return multiplex.listed(owner)

    assert asyncio.run(scenario()) == []


def test_two_requests_for_one_model_keep_it_listed_until_the_last_one_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, _ = a_replica()
    gates = [asyncio.Event(), asyncio.Event()]
    started: list[int] = []

    async def replay(app: Any, request: Forwarded) -> AsyncIterator[Part]:
        n = len(started)
        started.append(n)
        await gates[n].wait()
        yield Start(400, ())

    monkeypatch.setattr(replica, "replay", replay)
    monkeypatch.setattr(serve, "get_multiplexed_model_id", lambda: "silero_vad")

    async def scenario() -> tuple[list[str], list[str]]:
        async def request() -> None:
            async for _ in owner.handle(REQUEST):
                pass

        first, second = asyncio.ensure_future(request()), asyncio.ensure_future(request())
        while len(started) < 2:
            await asyncio.sleep(0)
        gates[0].set()
        await first
        owner._trim()
        while_one_runs = multiplex.listed(owner)
        gates[1].set()
        await second
        return while_one_runs, multiplex.listed(owner)

    assert asyncio.run(scenario()) == (["silero_vad"], [])


# ---- any interleaving of requests, loads, unloads and reports -------------------------------

MODELS = ("a", "b")
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.sampled_from(MODELS)),
        st.tuples(st.just("admit"), st.integers(0, 5)),
        st.tuples(st.just("load"), st.integers(0, 5)),
        st.tuples(st.just("finish"), st.integers(0, 5)),
        st.tuples(st.just("unload"), st.sampled_from(MODELS)),
        st.tuples(st.just("report")),
    ),
    max_size=30,
)


class Fleet:
    """One replica's requests as scripted steps: each request's replay waits to be admitted
    (then counts as active in the runtime's rows), may load its model, and waits to finish.
    Ray's multiplexed model id is the request's (a context variable of its task)."""

    def __init__(self, owner: VoxpoolReplica, runtime: Runtime) -> None:
        self.owner, self.runtime = owner, runtime
        self.rows = {m: Row(m) for m in MODELS}
        self.requests: list[tuple[str, asyncio.Event, asyncio.Event, asyncio.Task[None]]] = []
        self.admitted: set[int] = set()
        self.finished: set[int] = set()

    def publish(self) -> None:
        self.runtime.rows = [r for r in self.rows.values() if r.loaded or r.active_slots]

    async def replay(self, app: Any, request: Forwarded) -> AsyncIterator[Part]:
        model, admit, finish, _ = self.requests[int(request.path.rsplit("/", 1)[1])]
        await admit.wait()
        self.rows[model].active_slots += 1
        self.publish()
        try:
            await finish.wait()
            yield Start(200, ())
        finally:
            self.rows[model].active_slots -= 1
            self.publish()

    def start(self, model: str) -> None:
        request = attrs.evolve(REQUEST, path=f"/v1/audio/vad/{len(self.requests)}")

        async def own() -> None:
            MODEL_ID.set(model)
            async for _ in self.owner.handle(request):
                pass

        self.requests.append(
            (model, asyncio.Event(), asyncio.Event(), asyncio.ensure_future(own()))
        )

    def must_be_listed(self) -> set[str]:
        serving = {m for i, (m, *_) in enumerate(self.requests) if i not in self.finished}
        return serving | {r.id for r in self.runtime.rows}


MODEL_ID: contextvars.ContextVar[str] = contextvars.ContextVar("model_id", default="")


@given(ops=OPS)
@settings(max_examples=150, deadline=None)
def test_a_model_in_use_on_the_replica_is_always_listed(ops: list[tuple[Any, ...]]) -> None:
    """Whatever the order of requests (listed, admitted, loading, finishing), loads, unloads
    and the reporter's trims, Ray lists every model the replica serves or keeps, and after a
    trim only those (found from scratch before the fix: a start, then a report)."""
    owner, runtime = a_replica()
    fleet = Fleet(owner, runtime)

    async def play() -> None:
        for op in ops:
            if op[0] == "start":
                fleet.start(op[1])
            elif op[0] in ("admit", "load", "finish") and op[1] < len(fleet.requests):
                model, admit, finish, _ = fleet.requests[op[1]]
                if op[0] == "admit":
                    admit.set()
                    fleet.admitted.add(op[1])
                elif op[0] == "load" and op[1] in fleet.admitted - fleet.finished:
                    fleet.rows[model].loaded = True
                    fleet.publish()
                elif op[0] == "finish" and op[1] in fleet.admitted:
                    finish.set()
                    fleet.finished.add(op[1])
            elif op[0] == "unload" and not fleet.rows[op[1]].active_slots:
                fleet.rows[op[1]].loaded = False
                fleet.publish()
            elif op[0] == "report":
                owner._trim()
                assert set(multiplex.listed(owner)) == fleet.must_be_listed()
            for _ in range(5):  # let the requests reach their next wait
                await asyncio.sleep(0)
            assert fleet.must_be_listed() <= set(multiplex.listed(owner)), op
        for _, admit, finish, task in fleet.requests:
            admit.set()
            finish.set()
            await task

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replica, "replay", fleet.replay)
        patch.setattr(serve, "get_multiplexed_model_id", MODEL_ID.get)
        asyncio.run(play())
