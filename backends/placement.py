"""Where a split's threads run: the caller stays on its core, the lanes helping it on the others.

A split (:meth:`backends.parallel.CoreShare.run`, the spinning helpers of
:mod:`backends.handoff`) wakes threads that slept since the last one. After a short
sleep the kernel puts a woken thread back on the core it left, which is idle; after a
longer one (a request arriving at an idle server) it may put it on the caller's own core,
where it waits behind the caller until the load balancer moves it, and the split runs on
one core. Measured on a 2-core Zen 5 VM (docs/performance.md, "Session 18"): Piper's short
sentence at two threads took 50.7-50.9 ms run back to back and 71.4-76.8 ms after 0.5 s
idle, as long as at one thread (70.7-71.7), with every thread free to run anywhere; with
the caller held on its core and the other threads on the other one, 54-57 ms either way.

So while a split runs, :func:`keep_here` holds the caller on the core it is on, and each
lane that joins it moves itself to the other cores of its allowed set (:func:`away_from`).
Which thread computes which piece never changes a result. A lane moves within the
process's CPU mask (what an operator set with ``taskset``, say), read when this module
loads; the caller gets back the mask it had. Where the process has one CPU, or the
platform has no ``sched_getcpu`` and ``sched_setaffinity`` (not Linux), nothing moves.
``VOXPOOL_PLACEMENT=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _sched_getcpu() -> Callable[[], Any] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):  # pragma: no cover - not glibc or musl
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    getcpu: Callable[[], Any] = fn
    return getcpu


_GETCPU = _sched_getcpu()
ENABLED = (
    _GETCPU is not None
    and hasattr(os, "sched_setaffinity")
    and os.environ.get("VOXPOOL_PLACEMENT", "1") != "0"
)
"""Whether splits place their threads (Linux, unless ``VOXPOOL_PLACEMENT=0``)."""

_local = threading.local()  # .now: the CPUs the thread was last moved onto
_PROCESS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
"""The CPUs the process may run on, read when this module loads (a thread created while its
creator is held on one CPU inherits that one CPU: its own mask says nothing then)."""


def current_cpu() -> int | None:
    """The CPU the calling thread runs on now, or None where it cannot be told."""
    if not ENABLED or _GETCPU is None:
        return None
    cpu = int(_GETCPU())
    return cpu if cpu >= 0 else None


def _allowed() -> frozenset[int]:
    return _PROCESS


def _set(cpus: frozenset[int]) -> bool:
    """The calling thread onto ``cpus``; False where that failed (a CPU gone offline, a
    cpuset changed: it stays where it was)."""
    _local.now = None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    return True


def _move(cpus: frozenset[int]) -> None:
    """A lane's thread onto ``cpus`` (no system call when it was moved there last)."""
    if getattr(_local, "now", None) != cpus and _set(cpus):
        _local.now = cpus


@contextmanager
def keep_here() -> Iterator[int | None]:
    """Holds the calling thread on the CPU it runs on for the block, then gives it back the
    mask it had; yields that CPU, or None when nothing is held (see the module doc)."""
    cpu = current_cpu()
    if cpu is None:
        yield None
        return
    before = frozenset(os.sched_getaffinity(0))
    if len(before) < 2 or cpu not in before or not _set(frozenset({cpu})):
        yield None
        return
    try:
        yield cpu
    finally:
        _set(before)


def others(cpu: int | None) -> frozenset[int] | None:
    """The process's CPUs other than ``cpu``; None when there are none (or ``cpu`` is None,
    or placement is off)."""
    if cpu is None or not ENABLED:
        return None
    rest = _allowed() - {cpu}
    return rest or None


def move(tid: int, cpus: frozenset[int]) -> bool:
    """Moves the thread ``tid`` (a native id) onto ``cpus``; False where that failed."""
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError:
        return False
    return True


def away_from(cpu: int | None) -> None:
    """Moves the calling thread (a lane joining a split) to the process's CPUs other than
    ``cpu`` (the caller's); nothing when ``cpu`` is None or no other CPU is allowed."""
    if cpu is None or not ENABLED:
        return
    others = _allowed() - {cpu}
    if others:
        _move(others)
