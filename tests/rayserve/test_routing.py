"""server.ray.routing: Ray's choice without the replicas a retried request must avoid."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray")

from server.ray.exchange import Forwarded
from server.ray.routing import AvoidingRouter, avoided, without


class Replica:
    """Stands for Ray's RunningReplica (only its id is read)."""

    def __init__(self, unique_id: str) -> None:
        self.replica_id = type("ReplicaID", (), {"unique_id": unique_id})()

    def __repr__(self) -> str:
        return self.replica_id.unique_id


A, B, C = Replica("a"), Replica("b"), Replica("c")


def ids(ranks: list[list[Any]]) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


class Pending:
    def __init__(self, *args: Any) -> None:
        self.args = list(args)


def test_the_avoid_list_comes_from_the_forwarded_request_only() -> None:
    request = Forwarded("POST", "/v1/audio/speech", b"", (), b"", avoid=("a", "b"))
    assert avoided(Pending(request)) == {"a", "b"}
    assert avoided(Pending("something else")) == frozenset()
    assert avoided(Pending()) == frozenset()
    assert avoided(None) == frozenset()


def test_without_an_avoid_list_rays_choice_stands() -> None:
    assert ids(without([[A, B]], [A, B, C], frozenset())) == [["a", "b"]]


def test_an_avoided_replica_is_dropped_from_rays_choice() -> None:
    assert ids(without([[A, B], [C]], [A, B, C], frozenset({"a"}))) == [["b"], ["c"]]


def test_when_ray_chose_only_avoided_replicas_two_others_are_offered() -> None:
    ranks = without([[A]], [A, B, C], frozenset({"a"}))
    assert len(ranks) == 1 and sorted(ids(ranks)[0]) == ["b", "c"]
    assert ids(without([[A, B]], [A, B, C], frozenset({"a", "b"}))) == [["c"]]


def test_when_every_replica_is_avoided_rays_choice_stands() -> None:
    assert ids(without([[A]], [A], frozenset({"a"}))) == [["a"]]


def test_the_router_filters_what_rays_power_of_two_choices_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

    async def rays_choice(self: Any, candidates: Any, pending: Any = None) -> list[list[Any]]:
        return [[A, B]]

    monkeypatch.setattr(PowerOfTwoChoicesRequestRouter, "choose_replicas", rays_choice)
    router = AvoidingRouter.__new__(AvoidingRouter)  # no deployment state is read
    request = Forwarded("POST", "/v1/audio/speech", b"", (), b"", avoid=("a",))
    ranks = asyncio.run(router.choose_replicas([A, B, C], Pending(request)))
    assert ids(ranks) == [["b"]]
