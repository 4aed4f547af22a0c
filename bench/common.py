"""Helpers shared by the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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


def markdown_table(rows: Sequence[Mapping[str, object]]) -> str:
    """``rows`` (dicts with the same keys) as a Markdown table, keys as the header."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)
