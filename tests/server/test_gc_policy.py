"""A load freezes what lives as long as a model, so full collections skip it
(server/gc_policy.py): frozen objects are out of every collection until the next load,
which collects what models unloaded since left in reference cycles."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import anyio
import pytest

from server import gc_policy
from server.config import parse_config
from server.provider import ThreadedProvider
from tests.server.test_family_registry import energy  # noqa: F401  (the fixture)


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen (the suite's process is shared)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_freezes_what_is_alive_and_the_next_settle_collects_its_cycles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gc_policy, "ENABLED", True)
    held = _Cycle()
    gone = weakref.ref(held)
    gc_policy.settle()
    assert gc.get_freeze_count() > 1000  # the interpreter's and the imports' objects
    del held  # now garbage, but only a collection that walks it can tell
    gc.collect()
    assert gone() is not None  # frozen: no collection walks it
    gc_policy.settle()  # the next load: unfreeze, collect, freeze
    assert gone() is None


def test_a_new_object_is_collected_as_usual_after_a_settle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gc_policy, "ENABLED", True)
    gc_policy.settle()
    late = _Cycle()
    gone = weakref.ref(late)
    del late
    gc.collect()
    assert gone() is None


def test_switched_off_nothing_is_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_policy, "ENABLED", False)
    gc_policy.settle()
    assert gc.get_freeze_count() == 0


def test_the_provider_settles_after_each_load(
    energy: object,  # noqa: F811  (the registered test family)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(gc_policy, "settle", lambda: calls.append(gc.get_freeze_count()))
    (model,) = parse_config({"models": [{"id": "e", "family": "energy_vad"}]}).models

    async def load_twice() -> None:
        provider = ThreadedProvider()
        for _ in range(2):
            factory = await provider.load(model.spec())
            await provider.release(model.spec(), factory)

    anyio.run(load_twice)
    assert len(calls) == 2  # a load each (a release settles nothing)
