"""Busy-timeout resolution, overrun predicate and slot validation (reference §2.5, §7.6)."""

from __future__ import annotations

import pytest

from core.events import Reason
from core.policy import (
    MISSING,
    Invalid,
    PolicyError,
    RuntimeKind,
    Valid,
    model_ceiling,
    overrun,
    resolve_busy_timeout,
    select_runtime,
    unwrap,
    validate_slots,
    validate_slots_for_runtime,
    validate_timeout_ms,
)


@pytest.mark.parametrize(
    ("ceiling", "override", "expected"),
    [
        (900000, None, 900000),
        (900000, 60000, 60000),
        (900000, 999999, 900000),
        (900000, 900000, 900000),
        (900000, 0, 900000),
        (0, 60000, 60000),
        (0, None, 0),
        (0, 0, 0),
    ],
)
def test_busy_timeout_resolution_table(ceiling: int, override: int | None, expected: int) -> None:
    assert resolve_busy_timeout(ceiling, override) == expected


def test_model_busy_timeout_overrides_server_and_may_exceed_it() -> None:
    assert model_ceiling(300000, None) == 300000
    assert model_ceiling(300000, 900000) == 900000
    assert model_ceiling(300000, 0) == 0


@pytest.mark.parametrize(
    ("since", "now", "timeout", "expected"),
    [
        (None, 5000, 1000, False),
        (1000, 1500, 1000, False),
        (1000, 2000, 1000, False),
        (1000, 2001, 1000, True),
        (1000, 99999, 0, False),
        (1000, 99999, -1, False),
    ],
)
def test_overrun_predicate_table(
    since: float | None, now: float, timeout: float, expected: bool
) -> None:
    assert overrun(since, now, timeout) is expected


@pytest.mark.parametrize("value", [1, 2, 16])
def test_model_slots_parallel_accepts(value: int) -> None:
    assert validate_slots(value) == Valid(value)


@pytest.mark.parametrize("value", [0, -1, 17, None, True, False, "2", 1.5, 2.0, 4294967297, [], {}])
def test_model_slots_parallel_rejects(value: object) -> None:
    result = validate_slots(value)
    assert isinstance(result, Invalid)
    assert result.reason is Reason.INVALID_SLOTS
    assert result.message == "model slots must be an integer between 1 and 16"


def test_model_slots_default_is_one_on_both_runtimes() -> None:
    assert validate_slots(MISSING) == Valid(1)
    assert validate_slots_for_runtime(RuntimeKind.ORIGINAL, MISSING) == Valid(1)
    assert validate_slots_for_runtime(RuntimeKind.PARALLEL, MISSING) == Valid(1)


@pytest.mark.parametrize("value", [1, 2, None, False, "4", 16, 0])
def test_legacy_runtime_rejects_any_explicit_slots(value: object) -> None:
    result = validate_slots_for_runtime(RuntimeKind.ORIGINAL, value)
    assert isinstance(result, Invalid)
    assert result.reason is Reason.SLOTS_REQUIRE_PARALLEL
    assert "slots requires --parallel-jobs" in result.message


def test_slots_never_above_advertised_capacity() -> None:
    assert validate_slots(4, capacity=4) == Valid(4)
    result = validate_slots(5, capacity=4)
    assert isinstance(result, Invalid)
    assert result.reason is Reason.CAPACITY_EXCEEDED
    assert "capacity=4" in result.message


def test_runtime_selection_is_the_flag() -> None:
    assert select_runtime(True) is RuntimeKind.PARALLEL
    assert select_runtime(False) is RuntimeKind.ORIGINAL


def test_unwrap_raises_with_reason() -> None:
    with pytest.raises(PolicyError) as info:
        unwrap(validate_slots(17))
    assert info.value.reason is Reason.INVALID_SLOTS
    assert unwrap(validate_slots(3)) == 3


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (300000, True),
        (-1, False),
        ("5", False),
        (True, False),
        (1.5, False),
        (10.0, True),
    ],
)
def test_timeout_validation(value: object, ok: bool) -> None:
    assert isinstance(validate_timeout_ms(value), Valid) is ok
