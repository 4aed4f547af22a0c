"""Batched models' slots (#14): engine rows bounded by MAX_BATCH_SLOTS, and the live feed.

A model registered with ``batching`` may have up to :data:`core.pool.MAX_BATCH_SLOTS` slots
(its pool is one session; the slots are its engine's rows), a session pool still at most
:data:`core.pool.MAX_PARALLEL_SESSIONS`. :class:`core.engine.Feed` carries a live member's
input from its owner to the engine.
"""

from __future__ import annotations

import pytest

from core.admission import Admission, Granted
from core.engine import Feed
from core.events import Reason
from core.policy import Invalid, Valid, validate_slots
from core.pool import MAX_BATCH_SLOTS, MAX_PARALLEL_SESSIONS


def test_admission_grants_every_batch_slot_at_once() -> None:
    adm = Admission("m", MAX_BATCH_SLOTS)
    granted = {adm.request(t, 0.0, None) for t in range(1, MAX_BATCH_SLOTS + 1)}
    slots = {d.lease.request_slot() for d in granted if isinstance(d, Granted)}
    assert slots == set(range(MAX_BATCH_SLOTS))
    assert adm.state().active == MAX_BATCH_SLOTS
    assert not isinstance(adm.request(MAX_BATCH_SLOTS + 1, 0.0, None), Granted)  # queued
    with pytest.raises(ValueError, match=str(MAX_BATCH_SLOTS)):
        Admission("m", MAX_BATCH_SLOTS + 1)


def test_configure_grows_the_slots_of_an_idle_model() -> None:
    adm = Admission("m", 2)
    adm.configure(40)
    got = [adm.request(t, 0.0, None) for t in range(1, 41)]
    assert all(isinstance(d, Granted) for d in got)
    assert adm.state().slots == 40


def test_policy_bounds_slots_by_kind_of_model() -> None:
    assert validate_slots(MAX_PARALLEL_SESSIONS) == Valid(MAX_PARALLEL_SESSIONS)
    refused = validate_slots(MAX_PARALLEL_SESSIONS + 1)
    assert isinstance(refused, Invalid) and refused.reason is Reason.INVALID_SLOTS
    assert validate_slots(1100, batching=True) == Valid(1100)
    too_many = validate_slots(MAX_BATCH_SLOTS + 1, batching=True)
    assert isinstance(too_many, Invalid) and str(MAX_BATCH_SLOTS) in too_many.message
    assert isinstance(validate_slots(True, batching=True), Invalid)


def test_a_feed_hands_its_pieces_over_once_in_order() -> None:
    feed = Feed()
    pokes: list[int] = []
    feed.on_push = lambda: pokes.append(1)
    assert not feed.ready and feed.take() == ([], False)
    feed.push("a")
    feed.push("b")
    assert feed.ready and len(pokes) == 2
    assert feed.take() == (["a", "b"], False)
    assert not feed.ready
    feed.hold(True)  # the engine keeps input it has not processed yet
    assert feed.ready
    feed.hold(False)
    feed.push("c")
    feed.close()
    feed.close()  # twice is a no-op
    assert feed.closed and feed.ready and len(pokes) == 4
    assert feed.take() == (["c"], True)
    assert not feed.ready  # the close was taken
    assert feed.take() == ([], True)
    with pytest.raises(ValueError, match="closed"):
        feed.push("d")
