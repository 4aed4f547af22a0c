"""The batching mutant, caught by a stateful Hypothesis test of BatchScheduler.

The simulator catches ``batch_slot_early_free`` through the runtime's batched
path (scenarios/batched_slow_reader_keeps_its_slot.toml and the fuzzer); this
model-based test plays owners (launch, read, release) and the decode driver
(poll, chunk, finish) against the scheduler and checks the ownership rule of
reference §6.5: until its owner releases it, a request's handle stays valid and
reads exactly the chunks decoded for that request, in order, then the end.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from core.batching import (
    BatchScheduler,
    Chunk,
    EndOfStream,
    Launched,
    NotReady,
    Released,
    SlotHandle,
    StepPlan,
)
from tests.mutants.catalogue import MUTANTS

MAX_BATCH = 2


class Ownership(RuleBasedStateMachine):
    """Owners and one decode driver sharing a 2-slot scheduler."""

    def __init__(self) -> None:
        super().__init__()
        self.s: BatchScheduler[tuple[int, int]] = BatchScheduler(MAX_BATCH, window=0.0)
        self.now = 0.0
        self.next_id = 0
        self.owners: dict[int, SlotHandle] = {}
        self.produced: dict[int, list[tuple[int, int]]] = {}
        self.read_so_far: dict[int, int] = {}
        self.ended: set[int] = set()

    @rule()
    def launch(self) -> None:
        rid = self.next_id
        self.next_id += 1
        got = self.s.launch(rid, self.now)
        if isinstance(got, Launched):
            self.owners[rid] = got.handle
            self.produced[rid] = []
            self.read_so_far[rid] = 0
        else:
            assert len(self.owners) == MAX_BATCH, "rejected while a slot had no owner"

    @rule(data=st.data())
    def step(self, data: Any) -> None:
        self.now += 1.0
        plan = self.s.poll(self.now)
        if not isinstance(plan, StepPlan):
            return
        for h in plan.advance:
            rid = self.s.request_of(h)
            assert isinstance(rid, int)
            chunk = (rid, len(self.produced[rid]))
            self.s.chunk_ready(h, chunk)
            self.produced[rid].append(chunk)
            if data.draw(st.booleans(), label=f"finish {rid}"):
                self.s.member_finished(h)
        for f in plan.finish:
            rid = self.s.request_of(f.handle)
            assert isinstance(rid, int)
            if f.emit_tail:
                tail = (rid, len(self.produced[rid]))
                self.s.chunk_ready(f.handle, tail)
                self.produced[rid].append(tail)
            self.s.tail_done(f.handle)

    @rule(data=st.data())
    def read(self, data: Any) -> None:
        if not self.owners:
            return
        rid = data.draw(st.sampled_from(sorted(self.owners)), label="owner")
        got = self.s.read(self.owners[rid])
        if isinstance(got, Chunk):
            assert got.data == self.produced[rid][self.read_so_far[rid]], (
                f"request {rid} read {got.data}"
            )
            self.read_so_far[rid] += 1
        elif isinstance(got, EndOfStream):
            assert self.read_so_far[rid] == len(self.produced[rid]), (
                "end before every chunk was read"
            )
            self.ended.add(rid)
        else:
            assert isinstance(got, NotReady), f"request {rid}, not yet released, read {got}"

    @rule(data=st.data())
    def release(self, data: Any) -> None:
        done = sorted(self.ended & set(self.owners))
        if not done:
            return
        rid = data.draw(st.sampled_from(done), label="release")
        assert isinstance(self.s.release(self.owners.pop(rid)), Released)

    @invariant()
    def owners_hold_their_slots(self) -> None:
        slots = [h.slot for h in self.owners.values()]
        assert len(slots) == len(set(slots)), "two owners hold one slot"
        for h in self.owners.values():
            assert self.s.handle_of(h.slot) == h, f"slot {h.slot} no longer belongs to its owner"
        assert not set(self.s.free_slots()) & set(slots), "an owned slot is on the free list"


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def test_real_scheduler_keeps_slots_until_the_owner_releases() -> None:
    run_state_machine_as_test(Ownership, settings=SETTINGS)


def test_batch_slot_early_free_mutant_is_caught() -> None:
    with (
        MUTANTS["batch_slot_early_free"].patch(),
        pytest.raises(AssertionError, match=r"owner|free list|read"),
    ):
        run_state_machine_as_test(Ownership, settings=SETTINGS)


def test_the_mutant_patch_is_undone() -> None:
    with MUTANTS["batch_slot_early_free"].patch():
        pass
    s: BatchScheduler[int] = BatchScheduler(1, window=0.0)
    launched = s.launch("r", 0.0)
    assert isinstance(launched, Launched)
    plan = s.poll(1.0)
    assert isinstance(plan, StepPlan)
    s.member_finished(launched.handle)
    finish = s.poll(2.0)
    assert isinstance(finish, StepPlan)
    s.tail_done(launched.handle)
    assert s.free_slots() == (), "a finished slot waits for its owner's release"
