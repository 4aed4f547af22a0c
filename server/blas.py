"""BLAS threads that follow the load: every core for a call that runs alone, one each when full.

Session calls run in worker threads, so slots already give parallelism; a BLAS
that also spreads every product over every core oversubscribes the machine when
the slots are busy (measured: a wave of 8 TTS requests on 4 slots took 56 s with
OpenBLAS's own threads, 5 s with one). But a single request on an idle machine
should get all of it. :class:`AdaptiveThreads` counts the session calls in flight
and, whenever that count changes, sets the BLAS thread count to
``max(1, cores // calls)``: one call alone gets every core, two calls on two
cores one each. The setting is process-wide (OpenBLAS's thread count is global:
``openblas_set_num_threads_local`` changes it for every thread too), and every
BLAS call reads it when it starts, so a call that started alone drops to its
share at its next product once another call begins. The same count is the
call's share for the numpy backend's splits (:mod:`backends.parallel`: the
independent pieces of one op, such as Whisper's encoder heads, on that many
cores, each with one BLAS thread), so the count is set through
:data:`backends.parallel.SHARE`, which holds the BLAS at one thread while a
split runs.

Results: OpenBLAS splits a product differently for different thread counts, so
outputs may differ in the last bits between 1 and n threads (never between runs
at the same count). The tolerances are declared in docs/server.md and tested in
tests/server/test_blas_threads.py: Whisper tokens identical, Silero VAD
probabilities within 1e-5, Piper audio within 1e-4.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from backends import parallel

log = logging.getLogger("voxpool.blas")


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def threads_for(calls: int, cores: int) -> int:
    """BLAS threads for each of ``calls`` concurrent session calls on ``cores`` CPUs."""
    return max(1, cores // max(1, calls))


AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
"""The CPU flags OpenBLAS's AVX-512 (``SkylakeX``) kernels use."""

WIDE_KERNELS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
"""OpenBLAS's kernel sets of 512-bit vectors (threadpoolctl's ``architecture``): any other
set forced on a CPU with AVX-512 runs narrower vectors."""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor ``/proc/cpuinfo``'s text lists."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def kernels_note(
    architecture: str | None, flags: frozenset[str], coretype: str | None
) -> str | None:
    """What to tell an operator whose environment's ``OPENBLAS_CORETYPE`` (``coretype``) has
    numpy's OpenBLAS run 256-bit kernels (``architecture``) on a CPU with AVX-512
    (``flags``): every product at half the vector width. Measured on a Zen 5 with
    ``OPENBLAS_CORETYPE=Haswell``: Piper 1.35-1.43 times piper-tts's time at one thread,
    0.87-0.96 with OpenBLAS's own choice (docs/performance.md, "Session 18"). The setting
    is the operator's to keep (voxpool never overrides it); None when there is nothing
    to say."""
    if not coretype or architecture is None or not AVX512.issubset(flags):
        return None
    if architecture.lower() in WIDE_KERNELS:
        return None
    return (
        f"OPENBLAS_CORETYPE={coretype} has numpy's OpenBLAS run its {architecture} kernels "
        "(256-bit or narrower) on a CPU with AVX-512: products run at half the vector width "
        "(unset it to let OpenBLAS choose)"
    )


def loaded_kernels() -> str | None:
    """The kernel set numpy's OpenBLAS runs (threadpoolctl's ``architecture``), or None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    try:
        found = threadpool_info()
    except Exception:  # a start-up note never stops the server
        return None
    for info in found:
        if info.get("internal_api") == "openblas" and info.get("architecture"):
            return str(info["architecture"])
    return None


def startup_kernels_note() -> str | None:
    """:func:`kernels_note` for this process and machine (None off Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = cpu_flags(f.read())
    except OSError:
        return None
    return kernels_note(loaded_kernels(), flags, os.environ.get("OPENBLAS_CORETYPE"))


def blas_setter() -> Callable[[int], None] | None:
    """A function that sets the process's core share (:data:`backends.parallel.SHARE`: the
    BLAS threads of every product and the pieces the numpy backend's splits run at once),
    or None when threadpoolctl or a BLAS is missing."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    if not ThreadpoolController().select(user_api="blas").lib_controllers:
        return None
    return parallel.SHARE.set_threads


class AdaptiveThreads:
    """Counts session calls in flight and keeps the BLAS threads at each call's share.

    :meth:`enter` and :meth:`leave` are called from the event loop thread around
    every session call (never concurrently); ``set_threads`` is looked up on the
    first call (the BLAS is loaded with the first model).
    """

    def __init__(self, cores: int, set_threads: Callable[[int], None] | None = None) -> None:
        self.cores = cores
        self.calls = 0
        self.current: int | None = None
        self._set = set_threads
        self._looked_up = set_threads is not None

    def enter(self) -> None:
        """A session call is about to start."""
        self.calls += 1
        self._apply()

    def leave(self) -> None:
        """A session call ended."""
        self.calls -= 1
        self._apply()

    def _apply(self) -> None:
        if not self._looked_up:
            self._looked_up = True
            self._set = blas_setter()
            if self._set is None:
                log.warning("no BLAS thread control found: BLAS keeps its own thread count")
        if self._set is None or self.calls == 0:
            return  # idle: keep the last setting (the next call sets its own)
        want = threads_for(self.calls, self.cores)
        if want != self.current:
            self._set(want)
            self.current = want
