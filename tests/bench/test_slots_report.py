"""Smoke test of the parallel-slots report (bench/slots.py) on a tiny real VAD workload.

One second of audio through real silero_vad runtimes at one and two slots: the
report must count failures, compare outputs exactly and compute time saved by
seed 003's formula. Timing figures are not asserted (shared machine).
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

from tests.bench.bench_module import bench_module

slots = bench_module("slots")


def test_time_saved_follows_the_seed_formula() -> None:
    assert slots.time_saved(200.0, 100.0) == pytest.approx(50.0)
    assert slots.time_saved(100.0, 125.0) == pytest.approx(-25.0)
    with pytest.raises(ValueError):
        slots.time_saved(0.0, 1.0)


def test_rss_is_read_from_proc() -> None:
    assert slots.rss_bytes() > 10 * 2**20  # this interpreter with numpy loaded


def test_tiny_vad_report_has_identical_outputs_and_no_failures() -> None:
    row = slots.run(slots.workload("silero_vad", seconds=1.0), n=2, repeats=3)
    assert (row.model, row.n, row.repeats) == ("silero_vad", 2, 3)
    assert row.failures == 0
    assert row.identical
    assert 0 < row.latency_median_ms <= row.latency_max_ms
    times = (row.orig_one_ms, row.one_ms, row.orig_serial_ms, row.one_serial_ms, row.many_ms)
    assert min(times) > 0
    assert len(row.cold_ms) == 3
    assert min(row.cold_ms) > 0
    base, candidate = row.orig_serial_ms, row.many_ms
    assert row.saved_pct == pytest.approx(100 * (base - candidate) / base)
    assert row.saved_vs_one_slot_pct == pytest.approx(
        slots.time_saved(row.one_serial_ms, candidate)
    )
    assert row.one_saved_pct == pytest.approx(slots.time_saved(row.orig_one_ms, row.one_ms))
    assert 10 < row.loaded_rss_mb <= row.peak_rss_mb
    lines = slots.table([row]).splitlines()
    assert len(lines) == 7  # two tables: header, rule, one row each, a blank line between
    assert lines[2].startswith("| silero_vad | speech_mix 1.0 s | 2 |")
    assert lines[2].endswith("| yes |")
    assert lines[6].startswith("| silero_vad | 2 |")


def test_differing_outputs_are_reported() -> None:
    counter = itertools.count()
    workload = attrs.evolve(
        slots.workload("silero_vad", seconds=0.5), fingerprint=lambda _: str(next(counter))
    )
    row = slots.run(workload, n=2, repeats=3)
    assert row.failures == 0
    assert not row.identical


def test_failed_requests_are_counted() -> None:
    good = slots.workload("silero_vad", seconds=0.5)

    def requests(n: int) -> list[Any]:
        return ["not a VadRequest"] * n

    row = slots.run(attrs.evolve(good, requests=requests), n=2, repeats=3)
    assert row.failures == 3 * 2 * 3  # 3 waves (2 serial, 1 concurrent) of n=2, 3 repeats
    assert not row.identical


def test_too_few_repeats_or_slots_are_refused() -> None:
    with pytest.raises(ValueError):
        slots.run(slots.workload("silero_vad", seconds=0.5), n=2, repeats=2)
    with pytest.raises(ValueError):
        slots.run(slots.workload("silero_vad", seconds=0.5), n=1, repeats=3)


def test_each_model_runs_in_a_fresh_interpreter() -> None:
    row = slots.in_child("silero_vad", 2, 3)
    assert (row.model, row.n, row.repeats, row.failures) == ("silero_vad", 2, 3, 0)
    assert row.identical
    assert len(row.cold_ms) == 3
    assert row.peak_rss_mb < 1024  # the child's own memory: a VAD model and its sessions
