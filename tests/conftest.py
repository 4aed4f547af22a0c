"""Fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends import parallel


@pytest.fixture(autouse=True)
def _core_share_follows_the_blas_again() -> Iterator[None]:
    """A test that runs the server's adaptive threads sets the process's core share
    (:data:`backends.parallel.SHARE`); the next test in the process follows the BLAS's own
    thread count again (a module's ``threadpool_limits``), not that share: a share left at 2
    put a later one-thread module's windows on two cores."""
    yield
    parallel.SHARE.set_threads(None)
