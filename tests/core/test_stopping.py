"""core.stopping: a stop point raises only inside a run whose flag is up."""

from __future__ import annotations

import contextvars

import pytest

from core.stopping import RunStopped, StopFlag, running, stop_point


def test_a_stop_point_outside_a_run_never_raises() -> None:
    stop_point()


def test_a_stop_point_raises_once_the_current_flag_is_up() -> None:
    flag = StopFlag()
    with running(flag):
        stop_point()  # not yet
        flag.stop()
        with pytest.raises(RunStopped):
            stop_point()
        flag.stop()  # idempotent
        with pytest.raises(RunStopped):
            stop_point()
    stop_point()  # the block restored "no run"


def test_nested_runs_restore_the_outer_flag() -> None:
    outer, inner = StopFlag(), StopFlag()
    with running(outer):
        with running(inner):
            outer.stop()
            stop_point()  # the inner run's flag is the current one
        with pytest.raises(RunStopped):
            stop_point()


def test_a_copied_context_carries_the_flag_as_worker_threads_get_it() -> None:
    flag = StopFlag()
    with running(flag):
        context = contextvars.copy_context()
    flag.stop()
    stop_point()  # this context: no run any more
    with pytest.raises(RunStopped):
        context.run(stop_point)
