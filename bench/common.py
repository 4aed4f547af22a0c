"""Helpers shared by the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def blas_threads(threads: int) -> Iterator[None]:
    """Limit BLAS (and OpenMP) threads for the block; without threadpoolctl the environment
    decides."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - then OMP/OPENBLAS_NUM_THREADS decide
        yield
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def array_backend(name: str) -> object:
    """The array backend called ``name`` (numpy, opencl, cuda) on its first device."""
    from server.provider import make_backend

    return make_backend(name, "0")
