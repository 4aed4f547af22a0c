"""Busy-timeout resolution, overrun predicate and slot validation (reference §2.5, §7.6)."""

from __future__ import annotations

import math

import pytest

from core.admission import Admission
from core.events import Reason
from core.guard import GuardAdmission
from core.policy import (
    MISSING,
    Invalid,
    PolicyError,
    RuntimeKind,
    Valid,
    bound,
    busy_timeout,
    exceeds,
    excess,
    model_ceiling,
    ms_to_seconds,
    overrun,
    resolve_busy_timeout,
    select_runtime,
    unbound_as_zero,
    unwrap,
    validate_slots,
    validate_slots_for_runtime,
    validate_timeout_ms,
)
from core.residency import ResidencyLimits


@pytest.mark.parametrize(
    ("ceiling", "override", "expected"),
    [
        (900000, None, 900.0),
        (900000, 60000, 60.0),
        (900000, 999999, 900.0),
        (900000, 900000, 900.0),
        (900000, 0, 900.0),
        (0, 60000, 60.0),
        (0, None, None),
        (0, 0, None),
    ],
)
def test_busy_timeout_resolution_table(
    ceiling: int, override: int | None, expected: float | None
) -> None:
    """Milliseconds as config and HTTP write them (0: unbounded or keep), seconds out (None:
    unbounded)."""
    assert busy_timeout(ceiling, None, override) == expected
    assert resolve_busy_timeout(ms_to_seconds(ceiling), ms_to_seconds(override or 0)) == expected


def test_model_busy_timeout_overrides_server_and_may_exceed_it() -> None:
    assert model_ceiling(300000, None) == 300000
    assert model_ceiling(300000, 900000) == 900000
    assert model_ceiling(300000, 0) == 0
    assert busy_timeout(300000, 900000) == 900.0
    assert busy_timeout(300000, 0) is None  # the model's own 0: unbounded, not the server's
    assert busy_timeout(0, 1500, 500) == 0.5


@pytest.mark.parametrize(
    ("since", "now", "timeout", "expected"),
    [
        (None, 5000, 1000, False),
        (1000, 1500, 1000, False),
        (1000, 2000, 1000, False),
        (1000, 2001, 1000, True),
        (1000, 99999, None, False),
    ],
)
def test_overrun_predicate_table(
    since: float | None, now: float, timeout: float | None, expected: bool
) -> None:
    assert overrun(since, now, timeout) is expected


def test_no_limit_is_none_in_typed_apis_and_zero_outside() -> None:
    assert (bound(0), bound(-1), bound(3), bound(0.0), bound(2.5)) == (None, None, 3, None, 2.5)
    assert (ms_to_seconds(0), ms_to_seconds(1500)) == (None, 1.5)
    assert (unbound_as_zero(None), unbound_as_zero(1.5)) == (0.0, 1.5)
    assert (exceeds(5, None), exceeds(5, 5), exceeds(6, 5)) == (False, False, True)
    assert (excess(9, None), excess(3, 5), excess(7, 5)) == (0, 0, 2)
    assert ResidencyLimits.from_config(0, 0) == ResidencyLimits() == ResidencyLimits(None, None)
    assert ResidencyLimits.from_config(2, 100) == ResidencyLimits(2, 100)


@pytest.mark.parametrize("timeout", [0, 0.0, -1.0, math.inf])
def test_admission_takes_none_for_unbounded_never_zero(timeout: float) -> None:
    with pytest.raises(ValueError, match="None"):
        Admission("m").request(1, 0.0, timeout)
    with pytest.raises(ValueError, match="None"):
        GuardAdmission("m").manage(1, 0.0, timeout)


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
